//! The signals a server outlives. Only SIGTERM and SIGINT stop it, gracefully
//! (`shutdown.rs`), and SIGKILL at once. SIGHUP reloads the gateway's prices
//! (`price_reload.rs`) and is logged where there are none; every other signal
//! whose default action ends the process (SIGUSR1, SIGUSR2, SIGALRM, ...) is
//! ignored, from the first instruction of `main`: a stray `kill -USR1` or a
//! SIGHUP sent while the server starts must not take a server down.
//!
//! The dispositions are set with `libc::signal`, not tokio's signal streams:
//! they must hold before the runtime exists (tokio's streams need one, and
//! are registered only once the server's parts are built), and an ignored
//! signal costs nothing afterwards, where a stream has to be polled for ever.
//! Tokio's own handler for SIGHUP, registered later, replaces the ignoring.

/// The signals that would end the process by default and mean nothing to a
/// server: ignored from the start of `serve`. SIGHUP is handled later
/// ([`nothing_to_reload_on_hangup`], `price_reload.rs`); SIGPIPE is already
/// ignored by Rust's runtime; SIGQUIT, SIGABRT and the faults keep their
/// default (a deliberate core dump, a program error).
#[cfg(unix)]
const STRAY: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO, // SIGPOLL on Linux: the same number
    libc::SIGXCPU,
    libc::SIGXFSZ,
];

/// SIGPWR (power failure) exists on Linux only.
#[cfg(target_os = "linux")]
const STRAY_LINUX: [libc::c_int; 1] = [libc::SIGPWR];
#[cfg(all(unix, not(target_os = "linux")))]
const STRAY_LINUX: [libc::c_int; 0] = [];

/// Sets each of [`STRAY`]'s signals to `disposition`.
#[cfg(unix)]
fn set_stray(disposition: libc::sighandler_t) {
    for signal in STRAY.into_iter().chain(STRAY_LINUX) {
        // SAFETY: SIG_IGN and SIG_DFL install no handler code, and a valid
        // signal number is given; the call only sets the process's disposition.
        unsafe {
            libc::signal(signal, disposition);
        }
    }
}

/// Ignores the stray signals: the first instruction of `main`, before any
/// thread or runtime exists.
pub fn ignore_stray() {
    #[cfg(unix)]
    set_stray(libc::SIG_IGN);
}

/// Gives the stray signals their default back: for the one-shot operator
/// commands, which a closed terminal's SIGHUP should end as it ends any command.
pub fn restore_default() {
    #[cfg(unix)]
    set_stray(libc::SIG_DFL);
}

/// Logs each SIGHUP of a server with no prices to reload (`why`: no gateway
/// section, or a configuration not read from a file).
pub fn nothing_to_reload_on_hangup(why: &'static str) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!(why, "SIGHUP received: nothing to reload");
            }
        });
    }
    #[cfg(not(unix))]
    let _ = why;
    Ok(())
}
