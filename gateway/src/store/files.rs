//! Private files on disk: the data directory (0700) and the files in it that hold tenant data
//! or secrets (0600: the SQLite database with its `-wal` and `-shm`, the local token, the
//! secrets env file, the configuration written by the API; the media directory 0700), made so
//! at creation whatever the umask, and tightened at start when an older build or an operator
//! left them looser (logged).
//!
//! Only permission bits are changed, never owners; a file that cannot be tightened (owned by
//! another user) is reported and the start goes on, since refusing would lock out data the
//! operator arranged on purpose.

use std::io;
use std::path::Path;

/// Files in the data directory that hold tenant data or secrets (besides the database).
const PRIVATE_FILES: &[&str] = &["local-token", "secrets.env", "config.yaml"];
/// Directories in the data directory that hold tenant data.
const PRIVATE_DIRS: &[&str] = &["media"];
/// The suffixes SQLite adds to the database's name for its companion files.
const SQLITE_COMPANIONS: &[&str] = &["-wal", "-shm", "-journal"];

const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents with mode 0700 (existing ones are left alone).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(DIR_MODE);
    }
    builder.create(dir)
}

/// The data directory: created 0700 when missing, else tightened to 0700; then the private
/// files and directories already in it tightened. The error names the directory.
pub fn secure_data_dir(dir: &Path) -> Result<(), String> {
    create_private_dir(dir)
        .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
    tighten(dir, DIR_MODE);
    for name in PRIVATE_DIRS {
        tighten(&dir.join(name), DIR_MODE);
    }
    for name in PRIVATE_FILES {
        tighten(&dir.join(name), FILE_MODE);
    }
    Ok(())
}

/// The SQLite database at `path` before it is opened: created empty with mode 0600 when
/// missing (SQLite gives its `-wal` and `-shm` the database's mode), else tightened together
/// with its companion files.
pub fn secure_sqlite_file(path: &Path) -> io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(FILE_MODE);
    }
    match opts.open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => tighten(path, FILE_MODE),
        Err(e) => return Err(e),
    }
    for suffix in SQLITE_COMPANIONS {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        tighten(Path::new(&name), FILE_MODE);
    }
    Ok(())
}

/// Removes the group and other bits beyond `mode` from an existing `path` (a missing one is
/// fine), logging what it changed or could not change.
#[cfg(unix)]
fn tighten(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    // symlink_metadata: a link is reported as such and not followed to something else.
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.file_type().is_symlink() {
        return;
    }
    let current = meta.permissions().mode() & 0o7777;
    if current & !mode == 0 {
        return;
    }
    let next = current & mode;
    let shown = path.display().to_string();
    let shown = crate::logging::escaped(&shown);
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(next)) {
        Ok(()) => tracing::warn!(
            path = %shown,
            from = %format_args!("{current:o}"),
            to = %format_args!("{next:o}"),
            "tightened the permissions of a private file"
        ),
        Err(e) => tracing::warn!(
            path = %shown,
            mode = %format_args!("{current:o}"),
            error = %e,
            "cannot tighten the permissions of a private file"
        ),
    }
}

#[cfg(not(unix))]
fn tighten(_path: &Path, _mode: u32) {}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_data_directory_and_its_files_are_made_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("new/data");
        secure_data_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&tmp.path().join("new")), 0o700);
        // An existing, looser directory and files are tightened; other bits are kept.
        let old = tmp.path().join("old");
        std::fs::create_dir(&old).unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(old.join("local-token"), "x").unwrap();
        std::fs::set_permissions(
            old.join("local-token"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::write(old.join("notes.txt"), "x").unwrap();
        std::fs::set_permissions(
            old.join("notes.txt"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        secure_data_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
        assert_eq!(mode(&old.join("local-token")), 0o600);
        assert_eq!(mode(&old.join("notes.txt")), 0o644);
        // A stricter mode stays as it is.
        std::fs::set_permissions(
            old.join("local-token"),
            std::fs::Permissions::from_mode(0o400),
        )
        .unwrap();
        secure_data_dir(&old).unwrap();
        assert_eq!(mode(&old.join("local-token")), 0o400);
    }

    #[test]
    fn database_files_are_created_and_tightened_to_0600() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("gateway.db");
        secure_sqlite_file(&db).unwrap();
        assert_eq!(mode(&db), 0o600);
        for f in ["gateway.db", "gateway.db-wal", "gateway.db-shm"] {
            let p = tmp.path().join(f);
            std::fs::write(&p, b"").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        secure_sqlite_file(&db).unwrap();
        for f in ["gateway.db", "gateway.db-wal", "gateway.db-shm"] {
            assert_eq!(mode(&tmp.path().join(f)), 0o600, "{f}");
        }
    }
}
