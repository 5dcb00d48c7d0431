//! What a call's messages hold as the simulator counts them, in both wire
//! formats: text and image blocks, the output bound, the prompt's tokens, and the
//! model's output cut into its tokens.

use serde::Deserialize;

use crate::sim::limits::{count_tokens, BYTES_PER_TOKEN};
use crate::sim::wire::{MAX_TOKENS_DEFAULT, MAX_TOKENS_MAX};

/// A message's content in both wire formats: a string, or blocks of which the text
/// ones count (`{"type": "text" | "input_text", "text": ...}`) and the images
/// (`crate::sim::vision`); other blocks (files) count nothing in the simulator.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<Block>),
}

/// One content block; only its text is read.
#[derive(Debug, Clone, Deserialize)]
pub struct Block {
    /// The block's kind (`text`, `input_text`, `image_url`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text block.
    #[serde(default)]
    pub text: Option<String>,
    /// An OpenAI image's `image_url`: an object in chat, a string in Responses.
    #[serde(default)]
    pub image_url: Option<serde_json::Value>,
    /// Responses' `detail`, beside its `image_url`.
    #[serde(default)]
    pub detail: Option<String>,
    /// An Anthropic image's `source`.
    #[serde(default)]
    pub source: Option<serde_json::Value>,
    /// Anthropic's cache breakpoint (`crate::sim::cache`).
    #[serde(default)]
    pub cache_control: Option<serde_json::Value>,
}

impl Block {
    /// Whether the block is an image of either wire format.
    pub fn is_image(&self) -> bool {
        matches!(self.kind.as_str(), "image_url" | "input_image" | "image")
    }

    /// The tokens `model` bills for this block when it is an image, else 0.
    pub fn image_tokens(&self, model: &str) -> u64 {
        if !self.is_image() {
            return 0;
        }
        let part = serde_json::json!({"image_url": self.image_url, "detail": self.detail, "source": self.source});
        crate::sim::vision::image_tokens(model, &part)
    }
}

impl Content {
    /// The texts the provider counts.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Content::Text(text) => vec![text.as_str()],
            Content::Blocks(blocks) => blocks.iter().filter_map(|b| b.text.as_deref()).collect(),
        }
    }

    /// The tokens of its images, as `model` bills them.
    pub fn image_tokens(&self, model: &str) -> u64 {
        match self {
            Content::Text(_) => 0,
            Content::Blocks(blocks) => blocks.iter().map(|b| b.image_tokens(model)).sum(),
        }
    }
}

/// Checks an output bound: 1..=[`MAX_TOKENS_MAX`], as providers bound output.
pub fn output_bound(name: &str, value: Option<u64>) -> Result<u64, String> {
    let bound = value.unwrap_or(MAX_TOKENS_DEFAULT);
    if (1..=MAX_TOKENS_MAX).contains(&bound) {
        Ok(bound)
    } else {
        Err(format!("{name} must be 1..={MAX_TOKENS_MAX}, got {bound}"))
    }
}

/// The provider's count of a prompt made of `texts`: [`count_tokens`] of each.
pub fn prompt_tokens<'a>(texts: impl IntoIterator<Item = &'a str>) -> u64 {
    texts.into_iter().map(count_tokens).sum()
}

/// The model's output of `tokens` tokens cut into its tokens: the streamed deltas
/// join to the text a non-streamed call answers.
pub fn output_words(tokens: u64) -> Vec<String> {
    let text = crate::sim::prompt::synthesize(tokens);
    let step = usize::try_from(BYTES_PER_TOKEN).expect("small");
    (0..text.len())
        .step_by(step)
        .map(|i| text[i..i + step].to_owned())
        .collect()
}
