//! File operations that stay beneath the directory the user gave (`--data-dir`): every
//! path inside it is resolved by the kernel with openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS), so a symbolic link (or `..`) inside the data directory can never
//! make datagen, a replay or a checkpoint read or write a file outside it. The directory
//! itself may be reached through a link: it is the user's choice.
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// A directory, opened once, beneath which paths are resolved.
pub struct Beneath {
    root: PathBuf,
    fd: OwnedFd,
}

impl Beneath {
    pub fn new(root: &Path) -> Result<Beneath> {
        let c = CString::new(root.as_os_str().as_bytes()).context("a path with a NUL byte")?;
        // SAFETY: c is NUL-terminated; a non-negative return is an fd we own.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            bail!("opening {}: {}", root.display(), std::io::Error::last_os_error());
        }
        Ok(Beneath { root: root.to_path_buf(), fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// `path` relative to the root: `path` is either relative or starts with the root.
    fn relative<'p>(&self, path: &'p Path) -> Result<&'p Path> {
        let rel = if path.is_absolute() {
            path.strip_prefix(&self.root)
                .map_err(|_| anyhow!("{}: not inside {}", path.display(), self.root.display()))?
        } else {
            path
        };
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            bail!("{}: a path inside {} must not hold '..' or '.'", path.display(), self.root.display());
        }
        Ok(rel)
    }

    fn openat2(&self, rel: &Path, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
        let c = CString::new(rel.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: if flags & libc::O_CREAT != 0 { mode as u64 } else { 0 },
            resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        // SAFETY: openat2 with a valid dirfd, a NUL-terminated path and an open_how of the
        // size passed; a non-negative return is an fd we own.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// The error for a failed resolution, saying which path escaped and how.
    fn explain(&self, path: &Path, e: std::io::Error) -> anyhow::Error {
        match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow!(
                "{}: a symbolic link inside {} (trainio never follows a link out of the directory it was given)",
                path.display(),
                self.root.display()
            ),
            Some(libc::EXDEV) => anyhow!("{}: resolves outside {}", path.display(), self.root.display()),
            _ => anyhow!("opening {}: {e}", path.display()),
        }
    }

    /// Opens `path` (inside the root) with open(2) `flags` and, when creating, `mode`.
    pub fn open(&self, path: &Path, flags: i32, mode: u32) -> Result<OwnedFd> {
        let rel = self.relative(path)?;
        self.openat2(rel, flags, mode).map_err(|e| self.explain(path, e))
    }

    /// A file to write from the start (created, or truncated), beneath the root. A file
    /// with more than one link (a hard link put there to a file elsewhere) is replaced by
    /// a new file, never written through.
    pub fn create(&self, path: &Path) -> Result<File> {
        use std::os::unix::fs::MetadataExt;
        let rel = self.relative(path)?;
        let file = File::from(self.open(path, libc::O_WRONLY | libc::O_CREAT, 0o644)?);
        let meta = file.metadata().with_context(|| format!("{}", path.display()))?;
        if meta.nlink() > 1 {
            drop(file);
            let c = CString::new(rel.as_os_str().as_bytes()).context("a path with a NUL byte")?;
            // SAFETY: unlinkat with a valid dirfd and a NUL-terminated relative path (its
            // directories were resolved beneath the root by the open above).
            if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) } != 0 {
                bail!(
                    "{}: has other hard links and cannot be replaced: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                );
            }
            return Ok(File::from(self.open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o644)?));
        }
        file.set_len(0).with_context(|| format!("truncating {}", path.display()))?;
        Ok(file)
    }

    /// Creates the directory `path` and its missing parents, each beneath the root.
    pub fn create_dirs(&self, path: &Path) -> Result<()> {
        let rel = self.relative(path)?;
        let mut at = PathBuf::new();
        for part in rel.components() {
            at.push(part);
            let c = CString::new(at.as_os_str().as_bytes()).context("a path with a NUL byte")?;
            // SAFETY: mkdirat with a valid dirfd and a NUL-terminated path.
            let rc = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    bail!("creating {}: {e}", self.root.join(&at).display());
                }
            }
            // What exists must be a real directory, not a link to one.
            self.openat2(&at, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| self.explain(&self.root.join(&at), e))?;
        }
        Ok(())
    }

    /// The size of the regular file `path`, or None when it is missing; a link or
    /// anything else in its place is an error.
    pub fn file_size(&self, path: &Path) -> Result<Option<u64>> {
        match self.open(path, libc::O_PATH, 0) {
            Ok(fd) => {
                let m = File::from(fd).metadata().with_context(|| format!("{}", path.display()))?;
                if !m.is_file() {
                    bail!("{}: not a regular file", path.display());
                }
                Ok(Some(m.len()))
            }
            Err(e) if e.root_cause().to_string().contains("No such file") => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trainio-beneath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn links_and_dotdot_never_leave_the_root() {
        let base = tmp("links");
        let (root, outside) = (base.join("root"), base.join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("precious"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("train")).unwrap();
        std::os::unix::fs::symlink(outside.join("precious"), root.join("f")).unwrap();
        let b = Beneath::new(&root).unwrap();
        let e = b.create(&root.join("train/a")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = b.create(&root.join("f")).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(b.create_dirs(&root.join("train/x")).is_err());
        assert!(b.create(Path::new("../outside/precious")).is_err());
        assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"x");
        assert!(std::fs::read_dir(&outside).unwrap().count() == 1);
        // Real directories and files are fine.
        b.create_dirs(&root.join("d/e")).unwrap();
        b.create(&root.join("d/e/g")).unwrap();
        assert_eq!(b.file_size(&root.join("d/e/g")).unwrap(), Some(0));
        assert_eq!(b.file_size(&root.join("d/e/missing")).unwrap(), None);
        assert!(b.file_size(&root.join("f")).is_err());
        // A hard link to a file outside is replaced, not written through.
        std::fs::hard_link(outside.join("precious"), root.join("h")).unwrap();
        std::io::Write::write_all(&mut b.create(&root.join("h")).unwrap(), b"new").unwrap();
        assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"x");
        assert_eq!(std::fs::read(root.join("h")).unwrap(), b"new");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
