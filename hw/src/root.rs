//! [`HostRoot`]: the directory under which every host path is read.

use std::path::{Component, Path, PathBuf};

/// Root under which all host paths are read (default `/`), like node_exporter's
/// `--path.rootfs`: an agent in a container reads the host's `/proc` and `/sys` from a bind
/// mount such as `/host`, and tests point it at a fixture tree.
///
/// Paths are joined lexically: `..` never climbs above the root. Symlinks inside the tree are
/// followed by the OS as usual, so an absolute symlink in a fixture resolves against the real
/// `/` (fixtures use relative links).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRoot {
    root: PathBuf,
}

impl HostRoot {
    /// A root at `root` (e.g. `/`, `/host`, or a fixture directory).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The on-disk path of host path `abs`: `/proc/meminfo` becomes `<root>/proc/meminfo`.
    /// A relative `abs` is taken as relative to the host's `/`.
    pub fn join(&self, abs: impl AsRef<Path>) -> PathBuf {
        self.root.join(host_relative(abs.as_ref()))
    }
}

impl Default for HostRoot {
    /// The real host: `/`.
    fn default() -> Self {
        Self::new("/")
    }
}

/// `abs` as a clean path relative to the host's `/`: root and `.` components dropped, `..`
/// popping at most back to the root.
pub(crate) fn host_relative(abs: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in abs.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_table() {
        let root = HostRoot::new("/x");
        let cases = [
            ("/proc/meminfo", "/x/proc/meminfo"),
            ("proc/meminfo", "/x/proc/meminfo"),
            ("/", "/x"),
            ("/sys/./fs//cgroup", "/x/sys/fs/cgroup"),
            ("/../../etc/machine-id", "/x/etc/machine-id"),
            ("/var/lib/../lib/kubelet", "/x/var/lib/kubelet"),
        ];
        for (input, want) in cases {
            assert_eq!(root.join(input), PathBuf::from(want), "{input}");
        }
    }

    #[test]
    fn default_is_slash() {
        let root = HostRoot::default();
        assert_eq!(root.root(), Path::new("/"));
        assert_eq!(root.join("/proc/loadavg"), PathBuf::from("/proc/loadavg"));
    }
}
