//! `ratelimiterd`: the HTTP rate limiting server.

fn main() {
    println!("ratelimiterd {}", env!("CARGO_PKG_VERSION"));
}
