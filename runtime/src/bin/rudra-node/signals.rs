//! How a node stops on SIGTERM and SIGINT.

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
