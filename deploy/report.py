"""The container checks' report: each faulty Compose run next to the clean one, and its timeline.

    python3 deploy/report.py target/container-checks
"""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = ["clean", "learner-killed", "learner-disconnected", "shard-restarted", "scheduler-restarted"]
summaries = {r: json.loads((out / r / "summary.json").read_text()) for r in runs if (out / r).is_dir()}
clean = summaries["clean"]
print("# Compose cluster: engine faults against the clean run (same seed)\n")
print("| run | test accuracy | vs clean | updates | updates lost | seconds |")
print("|---|---|---|---|---|---|")
for run, s in summaries.items():
    delta = s["final_test_accuracy"] - clean["final_test_accuracy"]
    print(
        f"| {run} | {s['final_test_accuracy']:.4f} | {delta:+.4f} | {s['updates']} | "
        f"{s['updates_lost']} | {s['wall_seconds']:.1f} |"
    )
for run in runs[1:]:
    timeline = out / run / "timeline.json"
    if timeline.is_file():
        print(f"\n## {run}: timeline\n")
        for t in json.loads(timeline.read_text()):
            print(f"- {t['seconds']:.2f} s, {t['kind']}: {t['what']}")
print("\nPlots of all the runs on the same axes: report/ (rudra-node report).")
