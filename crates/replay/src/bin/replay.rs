//! `replay`: replays an LLM request trace against a simulated provider through a
//! limiting strategy and reports 429s, utilization and queueing delay.

use clap::Parser;

fn main() {
    let args = replay::cli::Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(replay::run::main(args)) {
        Ok(()) => {}
        Err(message) => {
            eprintln!("replay: {message}");
            std::process::exit(1);
        }
    }
}
