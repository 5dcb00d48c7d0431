//! Driving the library's async functions from Python threads.

use std::future::Future;
use std::pin::pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use tokio::runtime::Runtime;

/// Worker threads of the remote limiter's runtime: HTTP calls mostly wait on the
/// network, so two threads serve many concurrent calls without taking cores
/// from the Python program.
const RUNTIME_THREADS: usize = 2;

/// The runtime the remote limiters share, created on first use: one per
/// process, so keep-alive connections and timers are shared too.
pub fn shared() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("llm-ratelimiter")
            .enable_all()
            .build()
            .expect("the operating system gives a runtime its threads")
    })
}

/// Runs a future that completes without waiting, as the memory backend's do
/// (one lock, no I/O): one poll, no runtime. A future that does wait is handed
/// to the shared runtime instead, so this is correct for any future.
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => shared().block_on(future),
    }
}
