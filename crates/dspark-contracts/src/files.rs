//! Bounded reads of small files (configs, shard indexes, STS tables).
//!
//! Untrusted paths may name a FIFO (a read never ends), a device such as `/dev/zero` (a read
//! never ends and fills memory), a directory, or a file that is huge or still growing. Every
//! small file the engine reads goes through [`read_bounded`]: the path must be a regular file
//! whose metadata size is within the limit, and the read itself is capped with
//! [`Read::take`], so a file that lies about its size or grows while being read cannot exhaust
//! memory either.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Why a bounded read failed; callers turn it into the error of their domain.
#[derive(Debug)]
pub enum ReadError {
    /// The file does not exist.
    NotFound,
    /// Opening or reading failed.
    Io(std::io::Error),
    /// The path is not a regular file; the string says what it is (`"a directory"`, ...).
    NotRegular(&'static str),
    /// The file holds more than the limit; the value is the size seen (at least `limit + 1`).
    TooLarge(u64),
}

impl ReadError {
    /// A one-line description for error messages (`limit` is the cap that applied).
    pub fn describe(&self, limit: u64) -> String {
        match self {
            ReadError::NotFound => "no such file".to_string(),
            ReadError::Io(e) => e.to_string(),
            ReadError::NotRegular(what) => {
                format!("not a regular file ({what}): only regular files are read")
            }
            ReadError::TooLarge(size) => {
                format!("the file is {size} bytes or more, the limit is {limit} bytes")
            }
        }
    }

    /// The crate's error for a failed read of `path` under `limit`: `missing-file` naming
    /// `what`, `io`, or what `other` makes of the description of any other failure.
    pub(crate) fn into_error(
        self,
        path: &Path,
        what: &str,
        limit: u64,
        other: impl FnOnce(String) -> crate::error::Error,
    ) -> crate::error::Error {
        match self {
            ReadError::NotFound => crate::error::Error::MissingFile {
                path: path.to_path_buf(),
                what: what.into(),
            },
            ReadError::Io(source) => crate::error::Error::Io {
                path: path.to_path_buf(),
                source,
            },
            other_failure => other(other_failure.describe(limit)),
        }
    }
}

fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let ft = meta.file_type();
    if ft.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_char_device() || ft.is_block_device() {
            return "a device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

/// Read the regular file at `path`, at most `limit` bytes.
///
/// The type and size are checked on the path's metadata before opening (opening a FIFO would
/// block until a writer appears) and again on the opened file; the read is capped at
/// `limit + 1` bytes, so a file larger than its metadata said is still refused.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    // Check the path first: `File::open` on a FIFO blocks until a writer appears.
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ => ReadError::Io(e),
    })?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind_of(&meta)));
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let file = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ => ReadError::Io(e),
    })?;
    // The path may have been swapped between the two checks: check the opened file too.
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular(kind_of(&meta)));
    }
    let cap = usize::try_from(meta.len()).unwrap_or(0).min(1 << 20);
    let mut bytes = Vec::with_capacity(cap);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, b"{}").unwrap();
        assert_eq!(read_bounded(&p, 2).unwrap(), b"{}");
        assert!(matches!(read_bounded(&p, 1), Err(ReadError::TooLarge(2))));
        assert!(matches!(
            read_bounded(dir.path(), 100),
            Err(ReadError::NotRegular("a directory"))
        ));
        assert!(matches!(
            read_bounded(&dir.path().join("none"), 100),
            Err(ReadError::NotFound)
        ));
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_refused_without_reading() {
        let p = Path::new("/dev/zero");
        if p.exists() {
            assert!(matches!(
                read_bounded(p, 100),
                Err(ReadError::NotRegular("a device"))
            ));
        }
    }
}
