//! Images as the simulated provider bills them (docs/provider-sim.md, "Images
//! and the prompt cache"), written apart from the gateway's own counting so
//! that each checks the other.
//!
//! OpenAI (<https://platform.openai.com/docs/guides/images-vision>, "Calculating
//! costs"): tiles for gpt-4o (85 + 170 per 512-px tile after fitting in 2,048 px
//! and scaling the shortest side to 768 px; `detail: low` is the 85) and
//! gpt-4o-mini (2,833 + 5,667 per tile); 32-px patches for gpt-4.1-mini (x 1.62),
//! gpt-4.1-nano (x 2.46) and o4-mini (x 1.72), an image above 1,536 patches
//! scaled down to fit. Anthropic (<https://platform.claude.com/docs/en/vision>):
//! width x height / 750 after scaling the long edge to 1,568 px and the image
//! to 1,600 tokens, padded to 28 px. The size is read from the image's bytes
//! (PNG, GIF, JPEG, WebP); the simulator fetches nothing, so an image by URL
//! is billed as a 1,024 x 1,024 one.

use base64::Engine;
use serde_json::Value;

/// The size an image by URL is billed at: the simulator fetches nothing.
pub const URL_IMAGE_SIZE_PX: (u64, u64) = (1_024, 1_024);

/// The tokens `model` bills for the image `part` (an OpenAI `image_url` or
/// `input_image` block, or an Anthropic `image` block).
pub fn image_tokens(model: &str, part: &Value) -> u64 {
    let nested = part.get("image_url").filter(|v| v.is_object());
    let url = nested
        .and_then(|v| v.get("url"))
        .or(part.get("image_url"))
        .and_then(Value::as_str);
    let detail = nested
        .and_then(|v| v.get("detail"))
        .or(part.get("detail"))
        .and_then(Value::as_str);
    let data = match url {
        Some(url) => url
            .strip_prefix("data:")
            .and_then(|u| u.split_once(";base64,"))
            .map(|(_, d)| d),
        None => part.get("source").and_then(|s| s.get("data")).and_then(Value::as_str),
    };
    let size = data
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .and_then(|bytes| size_of(&bytes))
        .unwrap_or(URL_IMAGE_SIZE_PX);
    bill(model, size, detail == Some("low"))
}

/// The model's bill for an image of `size`.
fn bill(model: &str, (width, height): (u64, u64), low: bool) -> u64 {
    let (w, h) = (width as f64, height as f64);
    if model.starts_with("claude") {
        let scale = (1_568.0 / w.max(h)).min((1_600.0 * 750.0 / (w * h)).sqrt()).min(1.0);
        let pad = |side: f64| ((side * scale).round() as u64).div_ceil(28) * 28;
        return (pad(w) * pad(h)).div_ceil(750);
    }
    let patches = [("gpt-4.1-mini", 162), ("gpt-4.1-nano", 246), ("o4-mini", 172)];
    if let Some((_, multiplier)) = patches.iter().find(|(prefix, _)| model.starts_with(prefix)) {
        let mut count = (w / 32.0).ceil() * (h / 32.0).ceil();
        if count > 1_536.0 {
            // OpenAI's example: shrink to the budget, then to whole patches across.
            let shrink = (1_536.0 * 32.0 * 32.0 / (w * h)).sqrt();
            let (w1, h1) = (w * shrink, h * shrink);
            let fit = (w1 / 32.0).floor() / (w1 / 32.0);
            count = ((w1 * fit / 32.0).ceil() * (h1 * fit / 32.0).ceil()).min(1_536.0);
        }
        return (count as u64 * multiplier).div_ceil(100);
    }
    let (base, tile) = if model.starts_with("gpt-4o-mini") {
        (2_833, 5_667)
    } else {
        (85, 170)
    };
    if low {
        return base;
    }
    let fit = (2_048.0 / w.max(h)).min(1.0);
    let short = (768.0 / (w.min(h) * fit)).min(1.0);
    let tiles = (w * fit * short / 512.0).ceil() * (h * fit * short / 512.0).ceil();
    base + tile * tiles as u64
}

/// Width and height from a PNG, GIF, JPEG or WebP file.
fn size_of(bytes: &[u8]) -> Option<(u64, u64)> {
    let be16 = |at: usize| Some(u64::from(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?)));
    let le16 = |at: usize| Some(u64::from(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?)));
    let be32 = |at: usize| Some(u64::from(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?)));
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => Some((be32(16)?, be32(20)?)),
        [b'G', b'I', b'F', ..] => Some((le16(6)?, le16(8)?)),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', b'V', b'P', b'8', b'X', ..] => {
            let le24 = |at: usize| Some(le16(at)? | u64::from(*bytes.get(at + 2)?) << 16);
            Some((le24(24)? + 1, le24(27)? + 1))
        }
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', b'V', b'P', b'8', b' ', ..] => {
            Some((le16(26)? & 0x3fff, le16(28)? & 0x3fff))
        }
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', b'V', b'P', b'8', b'L', ..] => {
            let bits = u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?);
            Some((u64::from(bits & 0x3fff) + 1, u64::from((bits >> 14) & 0x3fff) + 1))
        }
        [0xff, 0xd8, ..] => {
            let mut at = 2;
            loop {
                let marker = *bytes.get(at + 1)?;
                if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
                    return Some((be16(at + 7)?, be16(at + 5)?));
                }
                at += 2 + usize::try_from(be16(at + 2)?).ok()?;
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn png(width: u32, height: u32) -> String {
        let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn images_are_billed_by_each_providers_rule() {
        let chat = |detail: &str| json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", png(1024, 1024)), "detail": detail}});
        assert_eq!(image_tokens("gpt-4o", &chat("high")), 765);
        assert_eq!(image_tokens("gpt-4o", &chat("low")), 85);
        assert_eq!(image_tokens("gpt-4o-mini", &chat("auto")), 25_501);
        assert_eq!(image_tokens("gpt-4.1-mini", &chat("high")), 1_659);
        let big = json!({"type": "input_image", "image_url": format!("data:image/png;base64,{}", png(1800, 2400))});
        // OpenAI's example: 1,452 patches, times 1.62.
        assert_eq!(image_tokens("gpt-4.1-mini", &big), (1_452u64 * 162).div_ceil(100));
        let claude =
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(1000, 1000)}});
        assert_eq!(
            image_tokens("claude-sonnet-4-5", &claude),
            (1008u64 * 1008).div_ceil(750)
        );
        let url = json!({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}});
        assert_eq!(
            image_tokens("claude-sonnet-4-5", &url),
            bill("claude", URL_IMAGE_SIZE_PX, false)
        );
    }
}
