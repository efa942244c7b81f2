//! Parquet files as Hugging Face datasets store text: an `id` column and a `text` column,
//! in two row groups. Shared by the integration tests, `data::prepare`'s unit tests and the
//! real-cluster dataset tests (e2e).

use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;

/// Writes `texts` to `path`.
pub fn write_texts(path: &Path, texts: &[String]) {
    let schema = Arc::new(
        parquet::schema::parser::parse_message_type(
            "message schema { REQUIRED INT64 id; REQUIRED BYTE_ARRAY text (UTF8); }",
        )
        .unwrap(),
    );
    let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    // Two row groups, as large datasets have.
    for chunk in texts.chunks(texts.len() / 2 + 1) {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let ids: Vec<i64> = (0..chunk.len() as i64).collect();
        col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = chunk.iter().map(|t| ByteArray::from(t.as_str())).collect();
        col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}
