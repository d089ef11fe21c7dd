//! The documents of a Parquet file: one per row, the string column `text_field`, read
//! row group by row group (the `parquet` crate's record reader, projected on the column).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::RowAccessor;
use parquet::schema::types::Type;

use super::Piece;
use crate::DataError;
use crate::corpus::sources::{Compression, SourceFile};

pub fn read(
    file: &SourceFile,
    column: &str,
    read: &AtomicU64,
    each: &mut dyn FnMut(Piece) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let path = &file.path;
    let corrupt = |reason: String| DataError::Corrupt {
        path: path.clone(),
        reason,
    };
    if file.compression != Compression::None {
        return Err(corrupt(
            "a Parquet file cannot be .gz or .zst (Parquet compresses inside the file)".into(),
        ));
    }
    let disk = std::fs::File::open(path).map_err(DataError::io(path))?;
    let reader = SerializedFileReader::new(disk)
        .map_err(|e| corrupt(format!("not a Parquet file ({e})")))?;
    let schema = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema();
    let Some(field) = schema.get_fields().iter().find(|f| f.name() == column) else {
        let names: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
        return Err(corrupt(format!(
            "no column {column:?} (set data.text_field to one of {})",
            names.join(", ")
        )));
    };
    let projection = Type::group_type_builder(schema.name())
        .with_fields(vec![Arc::clone(field)])
        .build()
        .map_err(|e| corrupt(e.to_string()))?;
    let rows = reader
        .get_row_iter(Some(projection))
        .map_err(|e| corrupt(e.to_string()))?;
    for (i, row) in rows.enumerate() {
        let bad = |reason: String| DataError::Record {
            path: path.clone(),
            line: i + 1,
            reason,
        };
        let row = row.map_err(|e| bad(e.to_string()))?;
        let text = row
            .get_string(0)
            .map_err(|_| bad(format!("the column {column:?} is not a string here")))?;
        if !text.is_empty() {
            each(Piece {
                bytes: text.as_bytes().to_vec(),
                offset: i + 1,
                last: true,
            })?;
        }
    }
    read.fetch_add(file.size, Ordering::Relaxed);
    Ok(())
}
