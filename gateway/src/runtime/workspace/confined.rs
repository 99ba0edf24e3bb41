//! File operations confined to one directory tree: every path is opened one component at a
//! time from the root's descriptor with `O_NOFOLLOW`, so no symbolic link is ever followed,
//! wherever it sits in the path and whenever it was planted (there is no check-then-open
//! window to race). A path through a symbolic link, or naming one, is refused.
//!
//! Blocking calls: the caller runs them on a blocking thread.

use std::fs::{File, Metadata};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// Why an operation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Error {
    /// Nothing at the path (or a directory on the way is missing).
    NotFound,
    /// The path leads through or to a symbolic link.
    Symlink,
    /// A file where a directory was needed, or the other way round.
    WrongKind(&'static str),
    /// Larger than the caller's cap.
    TooLarge(u64),
    /// Anything else the system said.
    Io(String),
}

impl From<Errno> for Error {
    fn from(e: Errno) -> Self {
        match e {
            Errno::NOENT => Error::NotFound,
            // O_NOFOLLOW on a link: ELOOP; O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR or ELOOP.
            Errno::LOOP => Error::Symlink,
            Errno::NOTDIR => Error::WrongKind("not a directory"),
            Errno::ISDIR => Error::WrongKind("a directory"),
            e => Error::Io(std::io::Error::from(e).to_string()),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(code) => Error::from(Errno::from_raw_os_error(code)),
            None => Error::Io(e.to_string()),
        }
    }
}

/// One entry of a directory, never followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub size: u64,
    pub modified_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Other,
}

/// A confined tree: the root's descriptor.
pub struct Root {
    fd: OwnedFd,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl Root {
    /// Opens `dir` (itself not followed if it is a link).
    pub fn open(dir: &Path) -> Result<Self, Error> {
        let fd = rustix::fs::open(dir, DIR_FLAGS, Mode::empty())?;
        Ok(Self { fd })
    }

    /// The directory `dirs` (already checked segments) below the root, opened without
    /// following links; `create`: missing ones are made (0755).
    fn dir(&self, dirs: &[&str], create: bool) -> Result<OwnedFd, Error> {
        let mut at = rustix::io::dup(&self.fd)?;
        for d in dirs {
            let next = match rustix::fs::openat(&at, *d, DIR_FLAGS, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&at, *d, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    rustix::fs::openat(&at, *d, DIR_FLAGS, Mode::empty())
                }
                other => other,
            };
            at = next.map_err(|e| self.kind_of(&at, d, e))?;
        }
        Ok(at)
    }

    /// Turns the error of opening `name` in `at` as a directory into what it means: a link
    /// is `Symlink` (ENOTDIR and ELOOP are both possible for one).
    fn kind_of(&self, at: &OwnedFd, name: &str, e: Errno) -> Error {
        if matches!(e, Errno::NOTDIR | Errno::LOOP) {
            if let Ok(st) = rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
                if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
                {
                    return Error::Symlink;
                }
            }
        }
        e.into()
    }

    /// The entries of the directory `dirs` (the root when empty), links not followed.
    pub fn list(&self, dirs: &[&str]) -> Result<Vec<Entry>, Error> {
        let dir = self.dir(dirs, false)?;
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                // A name that is not UTF-8 cannot be named back through the API.
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let name = name.to_owned();
            let fd = match rustix::fs::openat(
                &dir,
                name.as_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Gone since the listing.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let meta = File::from(fd).metadata()?;
            out.push(Entry {
                name,
                kind: kind(&meta),
                size: meta.len(),
                modified_ms: modified_ms(&meta),
            });
        }
        Ok(out)
    }

    /// The content of the file `dirs/name`, at most `max` bytes (`TooLarge` past it), and its
    /// metadata.
    pub fn read(&self, dirs: &[&str], name: &str, max: u64) -> Result<(Vec<u8>, Metadata), Error> {
        let dir = self.dir(dirs, false)?;
        let fd = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| self.kind_of(&dir, name, e))?;
        let mut file = File::from(fd);
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(Error::WrongKind(if meta.is_dir() {
                "a directory"
            } else {
                "not a regular file"
            }));
        }
        if meta.len() > max {
            return Err(Error::TooLarge(meta.len()));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        // Bounded even if the file grows while it is read.
        (&mut file).take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(Error::TooLarge(bytes.len() as u64));
        }
        Ok((bytes, meta))
    }

    /// Writes `bytes` to `dirs/name` atomically (a new file beside it, synced, then renamed
    /// over it), creating missing directories; a link or a directory at the name is refused.
    pub fn write(&self, dirs: &[&str], name: &str, bytes: &[u8]) -> Result<(), Error> {
        let dir = self.dir(dirs, true)?;
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                rustix::fs::FileType::RegularFile => {}
                rustix::fs::FileType::Symlink => return Err(Error::Symlink),
                rustix::fs::FileType::Directory => return Err(Error::WrongKind("a directory")),
                _ => return Err(Error::WrongKind("not a regular file")),
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let tmp = format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple());
        let fd = rustix::fs::openat(
            &dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        let mut file = File::from(fd);
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        drop(file);
        if let Err(e) = written {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
            return Err(e.into());
        }
        if let Err(e) = rustix::fs::renameat(&dir, tmp.as_str(), &dir, name) {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
            return Err(e.into());
        }
        Ok(())
    }

    /// Deletes the regular file `dirs/name` (a link, directory or other kind is refused).
    pub fn delete(&self, dirs: &[&str], name: &str) -> Result<(), Error> {
        let dir = self.dir(dirs, false)?;
        let st = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            rustix::fs::FileType::Symlink => return Err(Error::Symlink),
            rustix::fs::FileType::Directory => return Err(Error::WrongKind("a directory")),
            _ => return Err(Error::WrongKind("not a regular file")),
        }
        rustix::fs::unlinkat(&dir, name, AtFlags::empty())?;
        Ok(())
    }
}

fn kind(meta: &Metadata) -> Kind {
    let t = meta.file_type();
    if t.is_symlink() {
        Kind::Symlink
    } else if t.is_dir() {
        Kind::Directory
    } else if t.is_file() {
        Kind::File
    } else {
        Kind::Other
    }
}

/// Modification time in epoch milliseconds (0 when unknown or before 1970).
pub fn modified_ms(meta: &Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_never_followed_anywhere_in_a_path() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("ws");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f.txt"), "inside").unwrap();
        symlink("/etc", root.join("etc")).unwrap();
        symlink("a", root.join("inner")).unwrap();
        symlink("a/f.txt", root.join("flink")).unwrap();
        let r = Root::open(&root).unwrap();
        assert_eq!(r.read(&["a"], "f.txt", 100).unwrap().0, b"inside");
        assert_eq!(
            r.read(&["etc"], "passwd", 1 << 20).unwrap_err(),
            Error::Symlink
        );
        assert_eq!(
            r.read(&["inner"], "f.txt", 100).unwrap_err(),
            Error::Symlink,
            "even inside"
        );
        assert_eq!(r.read(&[], "flink", 100).unwrap_err(), Error::Symlink);
        assert_eq!(r.write(&["etc"], "x", b"no").unwrap_err(), Error::Symlink);
        assert_eq!(r.write(&[], "flink", b"no").unwrap_err(), Error::Symlink);
        assert_eq!(r.delete(&[], "flink").unwrap_err(), Error::Symlink);
        assert_eq!(std::fs::read(root.join("a/f.txt")).unwrap(), b"inside");
        let list = r.list(&[]).unwrap();
        let etc = list.iter().find(|e| e.name == "etc").unwrap();
        assert_eq!(etc.kind, Kind::Symlink, "listed, not followed");
        assert_eq!(r.list(&["etc"]).unwrap_err(), Error::Symlink);
        // A root that is itself a link is refused too.
        assert!(Root::open(&root.join("etc")).is_err());
    }

    #[test]
    fn reads_are_capped_and_writes_atomic() {
        let t = tempfile::tempdir().unwrap();
        let r = Root::open(t.path()).unwrap();
        r.write(&["d", "e"], "f.bin", &[1, 2, 3]).unwrap();
        assert_eq!(
            r.read(&["d", "e"], "f.bin", 3).unwrap().0,
            [1, 2, 3],
            "at the cap"
        );
        assert_eq!(
            r.read(&["d", "e"], "f.bin", 2).unwrap_err(),
            Error::TooLarge(3)
        );
        r.write(&["d", "e"], "f.bin", b"new").unwrap();
        assert_eq!(std::fs::read(t.path().join("d/e/f.bin")).unwrap(), b"new");
        let names: Vec<String> = r
            .list(&["d", "e"])
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["f.bin"], "no temporary file left");
        assert_eq!(
            r.read(&["d"], "e", 10).unwrap_err(),
            Error::WrongKind("a directory")
        );
        assert_eq!(
            r.delete(&["d"], "e").unwrap_err(),
            Error::WrongKind("a directory")
        );
        assert_eq!(r.read(&["nope"], "x", 10).unwrap_err(), Error::NotFound);
        r.delete(&["d", "e"], "f.bin").unwrap();
        assert_eq!(r.delete(&["d", "e"], "f.bin").unwrap_err(), Error::NotFound);
    }
}
