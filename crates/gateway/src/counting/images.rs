//! Images counted as their provider bills them (docs/gateway.md, "Counting"):
//! the size read from the image's own header when the request carries the
//! bytes (a data URL or a base64 source), the model's rule applied to it
//! ([`ImageRule`], one per row of [`crate::counting::model_table`]), and the rule's
//! largest figure when the size cannot be known (an image by URL or by file id).

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Decoded bytes read first: every PNG, GIF and WebP header, and most JPEG
/// ones, lie within them.
pub const HEADER_BYTES_FIRST: usize = 4 * 1024;
/// The most decoded bytes scanned for a JPEG's frame header: metadata segments
/// (EXIF, ICC profiles) come before it and may be large; past this bound the
/// image counts at its model's maximum instead of being decoded further.
pub const HEADER_BYTES_MAX: usize = 1024 * 1024;
/// The side of OpenAI's tiles.
const TILE_PX: f64 = 512.0;
/// The square OpenAI fits an image into before tiling.
const TILE_FIT_PX: f64 = 2_048.0;
/// The shortest side OpenAI scales a large image to before tiling.
const TILE_SHORT_SIDE_PX: f64 = 768.0;
/// The most tiles an image can take after OpenAI's two scalings (768 x 2,048).
const TILES_MAX: u64 = 8;
/// The side of OpenAI's patches.
const PATCH_PX: f64 = 32.0;
/// Anthropic's pixels per token.
const AREA_PX_PER_TOKEN: u64 = 750;
/// Anthropic pads an image to a multiple of this many pixels on each axis.
const AREA_PAD_PX: u64 = 28;

/// How a model bills one image (sources in [`crate::counting::model_table`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRule {
    /// OpenAI's tiles: fit in 2,048 x 2,048, shortest side down to 768, then
    /// `base + tile x` the 512-px tiles covering it; `detail: low` is the base.
    Tiles {
        /// Tokens of every image (and all of a `detail: low` one).
        base_tokens: u64,
        /// Tokens per 512-px tile.
        tile_tokens: u64,
    },
    /// OpenAI's patches: the 32-px patches covering the image, at most the cap
    /// (a larger image is scaled down to it), times the model's multiplier.
    /// `detail` does not change the count (measured: OpenAI's forum threads
    /// cited in the table).
    Patches {
        /// The most patches an image is billed.
        cap_patches: u64,
        /// The multiplier, in hundredths.
        multiplier_hundredths: u64,
    },
    /// Anthropic's area: scaled down to the long edge and the token cap, padded
    /// to 28 px, width x height / 750.
    Area {
        /// The longest edge the model reads.
        long_edge_px: u64,
        /// The tokens above which an image is scaled down.
        area_tokens_max: u64,
    },
}

impl ImageRule {
    /// The tokens of an image of `size` (width, height), or of the largest image
    /// the model bills when the size is unknown; `detail_low` for OpenAI's
    /// `detail: "low"`.
    pub fn tokens(&self, size: Option<(u32, u32)>, detail_low: bool) -> u64 {
        match (*self, size) {
            (ImageRule::Tiles { base_tokens, .. }, _) if detail_low => base_tokens,
            (_, None) => self.max_tokens(),
            (_, Some((0, _) | (_, 0))) => self.max_tokens(),
            (rule, Some((width, height))) => rule.sized(f64::from(width), f64::from(height)),
        }
    }

    fn sized(self, mut width: f64, mut height: f64) -> u64 {
        match self {
            ImageRule::Tiles {
                base_tokens,
                tile_tokens,
            } => {
                let fit = (TILE_FIT_PX / width.max(height)).min(1.0);
                (width, height) = (width * fit, height * fit);
                let short = (TILE_SHORT_SIDE_PX / width.min(height)).min(1.0);
                (width, height) = (width * short, height * short);
                let tiles = ceil(width / TILE_PX) * ceil(height / TILE_PX);
                base_tokens + tile_tokens * tiles.min(TILES_MAX)
            }
            ImageRule::Patches {
                cap_patches,
                multiplier_hundredths,
            } => {
                // Above the cap OpenAI scales the image down to about the cap;
                // the cap itself is never below what it bills.
                let patches = (ceil(width / PATCH_PX) * ceil(height / PATCH_PX)).min(cap_patches);
                (patches * multiplier_hundredths).div_ceil(100)
            }
            ImageRule::Area {
                long_edge_px,
                area_tokens_max,
            } => {
                let long = long_edge_px as f64 / width.max(height);
                let area = ((area_tokens_max * AREA_PX_PER_TOKEN) as f64 / (width * height)).sqrt();
                let scale = long.min(area).min(1.0);
                let padded = |side: f64| ceil(side * scale / AREA_PAD_PX as f64) * AREA_PAD_PX;
                (padded(width) * padded(height)).div_ceil(AREA_PX_PER_TOKEN)
            }
        }
    }

    /// The most one image can cost on this rule: what an image of unknown size
    /// is reserved.
    pub fn max_tokens(&self) -> u64 {
        match *self {
            ImageRule::Tiles {
                base_tokens,
                tile_tokens,
            } => base_tokens + tile_tokens * TILES_MAX,
            ImageRule::Patches {
                cap_patches,
                multiplier_hundredths,
            } => (cap_patches * multiplier_hundredths).div_ceil(100),
            ImageRule::Area {
                long_edge_px,
                area_tokens_max,
            } => {
                // The area cap, plus the padding of the widest image at it: the
                // sum of its sides is at most the long edge plus area / long edge.
                let area_px = area_tokens_max * AREA_PX_PER_TOKEN;
                let sides = long_edge_px + area_px.div_ceil(long_edge_px);
                let padding = AREA_PAD_PX * (sides + 2) + AREA_PAD_PX * AREA_PAD_PX;
                area_tokens_max + padding.div_ceil(AREA_PX_PER_TOKEN)
            }
        }
    }
}

fn ceil(value: f64) -> u64 {
    // Sides are at most 2^32 pixels: the float holds them exactly.
    value.ceil() as u64
}

/// The size of the image a `data:` URL carries, read from its header; `None`
/// for any other URL, a URL that is not base64, or a header not found.
pub fn data_url_size(url: &str) -> Option<(u32, u32)> {
    let (meta, data) = url.strip_prefix("data:")?.split_once(',')?;
    if !meta.ends_with(";base64") {
        return None;
    }
    base64_size(data)
}

/// The size of a base64-encoded image, read from its header: at most
/// [`HEADER_BYTES_MAX`] bytes are decoded.
pub fn base64_size(data: &str) -> Option<(u32, u32)> {
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let mut limit = HEADER_BYTES_FIRST;
    loop {
        // Four characters make three bytes: decode a whole number of groups.
        let characters = (limit / 3 * 4).min(data.len()) / 4 * 4;
        let characters = if data.len() - characters < 4 {
            data.len()
        } else {
            characters
        };
        let bytes = engine.decode(data.get(..characters)?).ok()?;
        match header_size(&bytes) {
            Header::Found(size) => return Some(size),
            Header::Unknown => return None,
            Header::NeedMore if characters < data.len() && limit < HEADER_BYTES_MAX => limit = HEADER_BYTES_MAX,
            Header::NeedMore => return None,
        }
    }
}

/// What a header read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The width and height.
    Found((u32, u32)),
    /// The bytes end before the size (a JPEG's frame header further on).
    NeedMore,
    /// Not an image of a known format, or a malformed one.
    Unknown,
}

/// The width and height of a PNG, GIF, WebP or JPEG image from its first bytes.
pub fn header_size(bytes: &[u8]) -> Header {
    let u16_le = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u24_le = |at: usize| bytes.get(at..at + 3).map(|b| u32::from_le_bytes([b[0], b[1], b[2], 0]));
    let u32_be = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let found = |size: Option<(u32, u32)>| size.map_or(Header::Unknown, Header::Found);
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        // The first chunk is IHDR: width and height, big-endian.
        return found(
            u32_be(16)
                .zip(u32_be(20))
                .filter(|_| bytes.get(12..16) == Some(&b"IHDR"[..])),
        );
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return found(u16_le(6).zip(u16_le(8)));
    }
    if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(&b"WEBP"[..]) {
        return match bytes.get(12..16) {
            // Lossy: the frame's 14-bit width and height after its start code.
            Some(b"VP8 ") => found(u16_le(26).zip(u16_le(28)).map(|(w, h)| (w & 0x3fff, h & 0x3fff))),
            // Lossless: 14 bits each, minus one, after the signature byte.
            Some(b"VP8L") => found(bytes.get(21..25).map(|b| {
                let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                ((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            })),
            // Extended: the canvas, 24 bits each, minus one.
            Some(b"VP8X") => found(u24_le(24).zip(u24_le(27)).map(|(w, h)| (w + 1, h + 1))),
            _ => Header::Unknown,
        };
    }
    if bytes.starts_with(&[0xff, 0xd8]) {
        return jpeg_size(bytes);
    }
    Header::Unknown
}

/// A JPEG's size from its start-of-frame segment, walking the segments before it.
fn jpeg_size(bytes: &[u8]) -> Header {
    let mut at = 2;
    loop {
        let Some(&[0xff, marker]) = bytes.get(at..at + 2) else {
            return if at + 2 > bytes.len() {
                Header::NeedMore
            } else {
                Header::Unknown
            };
        };
        match marker {
            // Fill bytes before a marker.
            0xff => at += 1,
            // Markers without a length.
            0x01 | 0xd0..=0xd8 => at += 2,
            // Start of frame (not DHT, JPG, DAC): length, precision, height, width.
            0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                let Some(frame) = bytes.get(at + 5..at + 9) else {
                    return Header::NeedMore;
                };
                let height = u32::from(u16::from_be_bytes([frame[0], frame[1]]));
                let width = u32::from(u16::from_be_bytes([frame[2], frame[3]]));
                return Header::Found((width, height));
            }
            // Start of scan or end of image before any frame: malformed.
            0xda | 0xd9 => return Header::Unknown,
            _ => {
                let Some(length) = bytes.get(at + 2..at + 4) else {
                    return Header::NeedMore;
                };
                at += 2 + usize::from(u16::from_be_bytes([length[0], length[1]]));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A PNG header of `width` x `height` (what the parser reads of a PNG).
    pub(crate) fn png(width: u32, height: u32) -> Vec<u8> {
        let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        bytes.extend(width.to_be_bytes());
        bytes.extend(height.to_be_bytes());
        bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
        bytes
    }

    /// A JPEG whose frame header follows an EXIF segment of `exif` bytes.
    fn jpeg(width: u16, height: u16, exif: usize) -> Vec<u8> {
        let mut bytes = vec![0xff, 0xd8, 0xff, 0xe1];
        bytes.extend(u16::try_from(exif + 2).unwrap().to_be_bytes());
        bytes.extend(vec![0u8; exif]);
        bytes.extend([0xff, 0xc2, 0x00, 0x11, 0x08]);
        bytes.extend(height.to_be_bytes());
        bytes.extend(width.to_be_bytes());
        bytes.extend([3; 12]);
        bytes
    }

    fn data_url(bytes: &[u8]) -> String {
        format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
    }

    #[test]
    fn headers_of_each_format_give_the_size() {
        assert_eq!(header_size(&png(1024, 768)), Header::Found((1024, 768)));
        assert_eq!(header_size(b"GIF89a\x20\x03\x58\x02rest"), Header::Found((800, 600)));
        let mut vp8 = b"RIFF\0\0\0\0WEBPVP8 \0\0\0\0\0\0\0\x9d\x01\x2a".to_vec();
        vp8.extend([0x80, 0x02, 0xe0, 0x01]);
        assert_eq!(header_size(&vp8), Header::Found((640, 480)));
        let mut vp8l = b"RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f".to_vec();
        vp8l.extend((99u32 | (49 << 14)).to_le_bytes());
        assert_eq!(header_size(&vp8l), Header::Found((100, 50)));
        let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\0\0\0\0\0\0\0\0".to_vec();
        vp8x.extend([0xff, 0x0f, 0x00, 0x37, 0x08, 0x00]);
        assert_eq!(header_size(&vp8x), Header::Found((4096, 2104)));
        assert_eq!(header_size(&jpeg(1920, 1080, 100)), Header::Found((1920, 1080)));
        assert_eq!(header_size(&jpeg(1920, 1080, 100)[..50]), Header::NeedMore);
        assert_eq!(header_size(b"not an image"), Header::Unknown);
        assert_eq!(header_size(&[0xff, 0xd8, 0xff, 0xda]), Header::Unknown);
    }

    #[test]
    fn data_urls_are_decoded_as_far_as_the_header_and_no_further() {
        assert_eq!(data_url_size(&data_url(&png(300, 200))), Some((300, 200)));
        // A JPEG frame header behind 60 KB of metadata: found in the second read.
        assert_eq!(data_url_size(&data_url(&jpeg(640, 480, 60_000))), Some((640, 480)));
        // Beyond the scan bound (segments chained past 1 MiB): unknown.
        let mut far = vec![0xff, 0xd8];
        for _ in 0..20 {
            far.extend([0xff, 0xe2, 0xff, 0xff]);
            far.extend(vec![0u8; 0xfffd]);
        }
        far.extend(&jpeg(10, 10, 0)[2..]);
        assert_eq!(data_url_size(&data_url(&far)), None);
        assert_eq!(data_url_size("https://example.com/cat.png"), None);
        assert_eq!(data_url_size("data:image/png,rawbytes"), None);
        assert_eq!(data_url_size("data:image/png;base64,!!!!"), None);
    }

    #[test]
    fn openai_tiles_follow_the_documented_examples() {
        let gpt_4o = ImageRule::Tiles {
            base_tokens: 85,
            tile_tokens: 170,
        };
        // "A 1024 x 1024 square image in detail: high mode costs 765 tokens";
        // "A 2048 x 4096 image in detail: high mode costs 1105 tokens"; low: 85.
        assert_eq!(gpt_4o.tokens(Some((1024, 1024)), false), 765);
        assert_eq!(gpt_4o.tokens(Some((2048, 4096)), false), 1105);
        assert_eq!(gpt_4o.tokens(Some((4096, 8192)), true), 85);
        assert_eq!(gpt_4o.tokens(Some((512, 512)), false), 255);
        assert_eq!(gpt_4o.tokens(None, false), 85 + 8 * 170);
        let mini = ImageRule::Tiles {
            base_tokens: 2_833,
            tile_tokens: 5_667,
        };
        assert_eq!(mini.tokens(Some((1024, 1024)), false), 2_833 + 4 * 5_667);
    }

    #[test]
    fn openai_patches_follow_the_documented_examples() {
        let gpt_41_mini = ImageRule::Patches {
            cap_patches: 1_536,
            multiplier_hundredths: 162,
        };
        // "1024 x 1024 ... 1024 patches"; times 1.62, rounded up.
        assert_eq!(gpt_41_mini.tokens(Some((1024, 1024)), false), 1_659);
        assert_eq!(
            gpt_41_mini.tokens(Some((1024, 1024)), true),
            1_659,
            "detail does not change it"
        );
        // "1800 x 2400 ... 1452 patches": counted at the cap, never below.
        assert_eq!(gpt_41_mini.tokens(Some((1800, 2400)), false), 2_489);
        assert_eq!(gpt_41_mini.tokens(None, false), 2_489);
    }

    #[test]
    fn anthropic_area_is_scaled_padded_and_capped() {
        let claude = ImageRule::Area {
            long_edge_px: 1_568,
            area_tokens_max: 1_600,
        };
        // 1092 x 1092 is Anthropic's largest 1:1 size at about 1,590 tokens.
        assert_eq!(claude.tokens(Some((1092, 1092)), false), (1092u64 * 1092).div_ceil(750));
        // 200 x 200 pads to 224 x 224.
        assert_eq!(claude.tokens(Some((200, 200)), false), (224u64 * 224).div_ceil(750));
        let max = claude.max_tokens();
        for (width, height) in [(8000, 8000), (8000, 100), (1568, 765), (1568, 766), (100, 8000), (1, 1)] {
            let tokens = claude.tokens(Some((width, height)), false);
            assert!(tokens <= max, "{width}x{height}: {tokens} > {max}");
            assert!(tokens <= 1_600 + 100, "{width}x{height}: {tokens}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        /// Any bytes: an answer, never a panic; a valid header cut anywhere is
        /// its size or "need more", never another size.
        #[test]
        fn any_bytes_are_read_without_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
                                            width in 1u16..u16::MAX, height in 1u16..u16::MAX, cut in 0usize..64) {
            let _ = header_size(&bytes);
            let mut jpeg_bytes = vec![0xff, 0xd8];
            jpeg_bytes.extend(&bytes);
            let _ = header_size(&jpeg_bytes);
            let _ = base64_size(&String::from_utf8_lossy(&bytes));
            let whole = jpeg(width, height, 10);
            let read = header_size(&whole[..cut.min(whole.len())]);
            proptest::prop_assert!(matches!(read, Header::NeedMore | Header::Unknown)
                || read == Header::Found((u32::from(width), u32::from(height))));
        }
    }
}
