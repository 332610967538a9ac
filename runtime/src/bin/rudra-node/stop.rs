//! How a node stops on its own: on SIGTERM and SIGINT, and on a panic in any of its threads.

/// Stop at once on SIGTERM or SIGINT, as a crash would (exit code 128 + the signal), even as
/// a container's first process, which the kernel otherwise shields from both: peers find the
/// node gone, and an engine restarts it if its policy says so.
pub(crate) fn stop_on_signals() {
    let watch = || -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let (mut term, mut int) = runtime.block_on(async {
            Ok::<_, std::io::Error>((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?))
        })?;
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let (name, code) = runtime.block_on(async {
                tokio::select! {
                    _ = term.recv() => ("SIGTERM", 143),
                    _ = int.recv() => ("SIGINT", 130),
                }
            });
            tracing::warn!("stopped by {name}");
            std::process::exit(code);
        })?;
        Ok(())
    };
    if let Err(e) = watch() {
        tracing::warn!("cannot watch for SIGTERM and SIGINT: {e}");
    }
}

/// End the process when any thread panics, after the panic's own message: a node whose actor
/// died must not live on looking healthy (answering probes, sending heartbeats) while its
/// work has stopped. Its peers then find it gone, and an engine restarts it (exit code 70).
pub(crate) fn stop_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "error: a thread of this node panicked; the node stops so that its peers and its engine see it fail"
        );
        std::process::exit(70);
    }));
}
