//! The tokenizer choice, measured (BENCHMARKS.md, "Gateway: tokenizer"):
//! `bpe-openai` against `tiktoken-rs` on the same texts in one run, counts
//! checked equal, rounds alternated so the machine's noise hits both alike.
//!
//! `cargo run --release -p gateway --example tokenizer_bench`

use std::time::{Duration, Instant};

/// Rounds per text and tokenizer; alternated.
const ROUNDS: usize = 7;

fn corpus() -> Vec<(&'static str, String)> {
    let prose = "The gateway counts every prompt before the call, reserves the prompt plus the output bound \
                 on every limit at once, and hands the unused part back when the provider reports its usage. ";
    let code =
        "fn main() {\n    let xs: Vec<u64> = (0..100).map(|x| x * x).collect();\n    println!(\"{:?}\", xs);\n}\n";
    let cjk = "速率限制器在调用之前计算每个提示的令牌数量，并一次性预留所有限制。";
    let mut digits = String::new();
    for i in 0..20_000u64 {
        digits.push_str(&(i.wrapping_mul(2_654_435_761) % 1_000_000).to_string());
    }
    vec![
        ("prose 1 KB (a chat turn)", prose.repeat(4)),
        ("prose 100 KB", prose.repeat(400)),
        ("code 100 KB", code.repeat(1_100)),
        ("CJK 30 KB", cjk.repeat(300)),
        ("digits 110 KB", digits),
        ("one 100 KB word (worst case)", "a".repeat(100_000)),
    ]
}

fn time(mut f: impl FnMut() -> usize, iterations: usize) -> (Duration, usize) {
    let start = Instant::now();
    let mut count = 0;
    for _ in 0..iterations {
        count = std::hint::black_box(f());
    }
    (start.elapsed() / iterations as u32, count)
}

fn main() {
    let start = Instant::now();
    let bpe = bpe_openai::o200k_base();
    bpe.count("warm");
    let bpe_load = start.elapsed();
    let start = Instant::now();
    let tiktoken = tiktoken_rs::o200k_base().expect("embedded vocabulary");
    let tiktoken_load = start.elapsed();
    println!("vocabulary load: bpe-openai {bpe_load:?}, tiktoken-rs {tiktoken_load:?}");
    println!(
        "{:<30} {:>8} {:>14} {:>14} {:>8}",
        "text", "tokens", "bpe-openai", "tiktoken-rs", "ratio"
    );
    for (name, text) in corpus() {
        let iterations = (2_000_000 / text.len()).clamp(1, 1_000);
        let (mut best_bpe, mut best_tik) = (Duration::MAX, Duration::MAX);
        let (mut bpe_count, mut tik_count) = (0, 0);
        for _ in 0..ROUNDS {
            let (elapsed, count) = time(|| bpe.count(text.as_str()), iterations);
            best_bpe = best_bpe.min(elapsed);
            bpe_count = count;
            let (elapsed, count) = time(|| tiktoken.encode_ordinary(&text).len(), iterations);
            best_tik = best_tik.min(elapsed);
            tik_count = count;
        }
        assert_eq!(bpe_count, tik_count, "{name}: the two tokenizers disagree");
        let mb_s = |d: Duration| text.len() as f64 / d.as_secs_f64() / 1e6;
        println!(
            "{:<30} {:>8} {:>9.1} MB/s {:>9.1} MB/s {:>7.1}x",
            name,
            bpe_count,
            mb_s(best_bpe),
            mb_s(best_tik),
            best_tik.as_secs_f64() / best_bpe.as_secs_f64()
        );
    }
}
