//! A deliberately broken rule, switched on only by the harness's own tests to show that the
//! harness catches a shard applying a repeated push; compiled out of every other build.

#[cfg(test)]
thread_local! {
    static ACCEPT_DUPLICATES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread's shards apply a push they already applied.
#[cfg(test)]
pub(crate) fn accepts_duplicates() -> bool {
    ACCEPT_DUPLICATES.get()
}

/// Never, outside the harness's own tests.
#[cfg(not(test))]
pub(crate) const fn accepts_duplicates() -> bool {
    false
}

/// Make this thread's shards apply repeated pushes (or stop).
#[cfg(test)]
pub(crate) fn accept_duplicates(on: bool) {
    ACCEPT_DUPLICATES.set(on);
}
