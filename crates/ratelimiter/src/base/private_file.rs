//! Files only their owner may read (0600 on Unix): the server's files that
//! hold what a reader could misuse, such as key hashes (the directory), who
//! spent what (the spend ledger) or live lease ids (the snapshot).

use std::fs::OpenOptions;
use std::path::Path;

/// The mode of such a file: read and write for its owner, nothing for others.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// `options` creating a file with [`PRIVATE_FILE_MODE`] (an existing file
/// keeps its mode: see [`make_private`]).
pub fn private_options(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, PRIVATE_FILE_MODE);
    options
}

/// Narrows the file at `path` to [`PRIVATE_FILE_MODE`]: a file an earlier
/// version created readable by others is tightened when it is opened. No
/// file there is no error.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
            Ok(meta) if meta.permissions().mode() & 0o777 == PRIVATE_FILE_MODE => return Ok(()),
            Ok(_) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(PRIVATE_FILE_MODE))?,
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
