//! TensorBoard's event file format: `Event` protocol buffers (the messages of
//! TensorBoard's `tensorboard/compat/proto/{event,summary,tensor,tensor_shape}.proto`
//! that a scalar or text summary needs, with their field numbers) in TFRecord framing:
//!
//! ```text
//! u64 length (LE) | u32 masked CRC-32C of the length | data | u32 masked CRC-32C of data
//! ```

use crc::{CRC_32_ISCSI, Crc};
use prost::Message;

const CRC32C: Crc<u32> = Crc::<u32>::new(&CRC_32_ISCSI);

/// `Event` (event.proto). Of its `what` oneof, `file_version` and `summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `Summary` (summary.proto).
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<Value>,
}

/// `Summary.Value`: a scalar (`simple_value`) or a tensor with its plugin's metadata.
#[derive(Clone, PartialEq, Message)]
pub struct Value {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `SummaryMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// `TensorProto` (tensor.proto), as a string tensor.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShapeProto>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `TensorShapeProto` (tensor_shape.proto): no dimensions is a scalar.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<Dim>,
}

/// `TensorShapeProto.Dim`.
#[derive(Clone, PartialEq, Message)]
pub struct Dim {
    #[prost(int64, tag = "1")]
    pub size: i64,
}

/// `DataType.DT_STRING` (types.proto).
const DT_STRING: i32 = 7;

/// What every event file starts with.
pub const FILE_VERSION: &str = "brain.Event:2";

impl Event {
    /// One summary of `values` at `step`.
    pub fn summary(wall_time: f64, step: u64, values: Vec<Value>) -> Event {
        Event { wall_time, step: step as i64, file_version: None, summary: Some(Summary { value: values }) }
    }

    /// The tags of the event's summary values.
    pub fn tags(&self) -> impl Iterator<Item = &str> {
        self.summary.iter().flat_map(|s| s.value.iter().map(|v| v.tag.as_str()))
    }
}

impl Value {
    pub fn scalar(tag: impl Into<String>, value: f64) -> Value {
        Value { tag: tag.into(), simple_value: Some(value as f32), tensor: None, metadata: None }
    }

    /// Markdown for TensorBoard's text dashboard.
    pub fn text(tag: impl Into<String>, markdown: &str) -> Value {
        Value {
            tag: tag.into(),
            simple_value: None,
            tensor: Some(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShapeProto { dim: Vec::new() }),
                string_val: vec![markdown.as_bytes().to_vec()],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData { plugin_name: "text".into(), content: Vec::new() }),
            }),
        }
    }
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = CRC32C.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One event as a framed record.
pub fn frame(event: &Event) -> Vec<u8> {
    let data = event.encode_to_vec();
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(&masked_crc(&data).to_le_bytes());
    out
}

/// The events of a file's bytes, and the byte offset where the readable records end:
/// `bytes.len()` for a whole file, less when its tail is torn (a write cut short by a
/// crash) or damaged.
pub fn read(bytes: &[u8]) -> (Vec<Event>, usize) {
    let mut events = Vec::new();
    let mut at = 0;
    while let Some((event, next)) = read_one(bytes, at) {
        events.push(event);
        at = next;
    }
    (events, at)
}

fn read_one(bytes: &[u8], at: usize) -> Option<(Event, usize)> {
    let word = |from: usize, n: usize| bytes.get(from..from.checked_add(n)?);
    let len = word(at, 8)?;
    let len_crc = u32::from_le_bytes(word(at + 8, 4)?.try_into().ok()?);
    if masked_crc(len) != len_crc {
        return None;
    }
    let n = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
    let data = word(at + 12, n)?;
    let data_crc = u32::from_le_bytes(word(at + 12 + n, 4)?.try_into().ok()?);
    if masked_crc(data) != data_crc {
        return None;
    }
    Some((Event::decode(data).ok()?, at + 16 + n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_crc_is_tensorflows() {
        // CRC-32C's check value; then the masked values of tensorboard's own
        // `record_writer.masked_crc32c`, of a payload and of a length field.
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"hello"), 0x191c_1fbb);
        assert_eq!(masked_crc(&42u64.to_le_bytes()), 0xf591_8dae);
    }

    #[test]
    fn records_round_trip_and_a_torn_or_damaged_tail_is_cut() {
        let events: Vec<Event> = (0..3)
            .map(|s| Event::summary(1.5 + s as f64, s, vec![Value::scalar("train/loss", 2.0 / (s + 1) as f64)]))
            .chain([Event::summary(9.0, 3, vec![Value::text("config", "# run\n`x: 1`")])])
            .collect();
        let bytes: Vec<u8> = events.iter().flat_map(frame).collect();
        assert_eq!(read(&bytes), (events.clone(), bytes.len()));
        let whole_three = events[..3].iter().map(|e| frame(e).len()).sum::<usize>();
        for cut in [bytes.len() - 1, whole_three + 7, whole_three + 13] {
            assert_eq!(read(&bytes[..cut]), (events[..3].to_vec(), whole_three), "cut at {cut}");
        }
        let mut damaged = bytes.clone();
        damaged[whole_three + 14] ^= 0xff;
        assert_eq!(read(&damaged), (events[..3].to_vec(), whole_three));
        // A length field claiming 2^60 bytes is refused by its CRC, and past the end.
        let mut huge = bytes[..whole_three].to_vec();
        let len = (1u64 << 60).to_le_bytes();
        huge.extend_from_slice(&len);
        huge.extend_from_slice(&masked_crc(&len).to_le_bytes());
        assert_eq!(read(&huge).1, whole_three);
    }
}
