//! Synthesized prompts: text of a given token count, since the traces carry sizes
//! and not content. Words of three letters and a space make exactly four bytes per
//! token, as English text averages, so the provider counts what the trace says.

use crate::sim::limits::BYTES_PER_TOKEN;

/// Three-letter words the text is made of: plain English, so a byte-counting
/// estimate sees what it would see on real prompts.
const WORDS: [&str; 16] = [
    "the", "cat", "sat", "off", "her", "red", "mat", "and", "ate", "two", "big", "fig", "for", "tea", "now", "six",
];

/// Text the provider counts as exactly `tokens` tokens: `4 * tokens` bytes.
pub fn synthesize(tokens: u64) -> String {
    let bytes = usize::try_from(tokens * BYTES_PER_TOKEN).expect("a prompt fits memory");
    let mut text = String::with_capacity(bytes);
    let mut i = 0usize;
    while text.len() < bytes {
        text.push_str(WORDS[i % WORDS.len()]);
        text.push(' ');
        i += 1;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::limits::count_tokens;

    #[test]
    fn synthesized_text_has_the_asked_token_count() {
        for tokens in [0, 1, 2, 7, 4808, 14_050] {
            let text = synthesize(tokens);
            assert_eq!(text.len() as u64, tokens * BYTES_PER_TOKEN);
            assert_eq!(count_tokens(&text), tokens);
        }
        assert_eq!(synthesize(3), "the cat sat ");
        assert!(WORDS.iter().all(|w| w.len() + 1 == BYTES_PER_TOKEN as usize));
    }
}
