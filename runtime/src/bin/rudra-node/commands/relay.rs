//! `rudra-node relay`: a fault-injecting UDP relay between two real nodes.

use std::time::Duration;

use rudra_actors::InvalidSetting;
use rudra_runtime::RuntimeError;
use rudra_transport::{LinkFaults, Relay, RelayRules};

use crate::cli::RelayArgs;

/// Relay until stopped, cutting and healing the link at the times given.
pub(crate) fn run(args: RelayArgs) -> Result<(), RuntimeError> {
    let ms = Duration::from_millis;
    let millis = |flag: &'static str, v: f64| {
        Duration::try_from_secs_f64(v / 1000.0).map_err(|_| {
            RuntimeError::Invalid(InvalidSetting::new(flag, format!("is {v}; give milliseconds, 0 or more")))
        })
    };
    let faults = LinkFaults {
        drop: args.drop,
        duplicate: args.duplicate,
        reorder: args.reorder,
        delay: millis("--delay-ms", args.delay_ms)?,
        jitter: millis("--jitter-ms", args.jitter_ms)?,
    };
    if !(args.rate_mbit.is_finite() && args.rate_mbit >= 0.0) {
        let why = format!("is {}; give Mbit/s, 0 for unlimited", args.rate_mbit);
        return Err(RuntimeError::Invalid(InvalidSetting::new("--rate-mbit", why)));
    }
    let rate = args.rate_mbit * 1e6 / 8.0;
    let rules = RelayRules { to_upstream: faults.clone(), to_client: faults, rate, ..RelayRules::default() };
    let to = args.to;
    actix::System::new().block_on(async move {
        let relay = Relay::bind(args.listen, to, rules, args.seed)?;
        tracing::info!("relaying {} → {to}", relay.local_addr()?);
        let control = relay.control();
        let switch = |at: Option<u64>, down: bool| {
            let control = control.clone();
            at.map(|at| {
                actix::spawn(async move {
                    tokio::time::sleep(ms(at)).await;
                    tracing::info!("link {}", if down { "cut" } else { "healed" });
                    control.set_down(down);
                })
            })
        };
        let _down = switch(args.down_at_ms, true);
        let _up = switch(args.up_at_ms, false);
        Ok(relay.run().await?)
    })
}
