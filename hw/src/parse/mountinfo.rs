//! The mount table: `/proc/<pid>/mountinfo`.

use std::path::{Path, PathBuf};

use crate::{Mount, ParseError};

/// Parses `/proc/<pid>/mountinfo` (kernel `Documentation/filesystems/proc.rst` §3.5), one
/// mount per line, in mount order:
///
/// ```text
/// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
/// (1)(2)(3)   (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)
/// ```
///
/// Field 5 is the mount point, 6 the per-mount options, 7 zero or more optional fields
/// ended by `-`, then the filesystem type, the source and the superblock options. Octal
/// escapes (`\040` for a space) are decoded. Errors: [`ParseError::Invalid`] naming the
/// first malformed line.
pub fn parse_mountinfo(text: &str) -> Result<Vec<Mount>, ParseError> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| mount_line(line).ok_or_else(|| ParseError::invalid("mountinfo line", line)))
        .collect()
}

fn mount_line(line: &str) -> Option<Mount> {
    let mut fields = line.split(' ');
    let mount_point = fields.nth(4)?;
    let mount_options = fields.next()?;
    // Optional fields up to the separator.
    fields.by_ref().find(|f| *f == "-")?;
    let fs_type = fields.next()?;
    let source = fields.next()?;
    let super_options = fields.next()?;
    let ro = |options: &str| options.split(',').any(|o| o == "ro");
    Some(Mount {
        mount_point: PathBuf::from(unescape(mount_point)),
        fs_type: unescape(fs_type),
        source: unescape(source),
        read_only: ro(mount_options) || ro(super_options),
    })
}

/// Decodes the kernel's `\ooo` escapes (space, tab, newline, backslash: `fs/seq_file.c:
/// mangle_path`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| {
            bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount that holds host path `path` (absolute, `..`-free): the longest mount point that
/// is `path` or one of its ancestors; of several mounts on that point, the last (it hides
/// the ones below it). `None` if no mount point matches (not even `/`).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Raspberry Pi OS mount table whose root was remounted read-only by ext4 after I/O
    /// errors: the mount says `rw`, the superblock `ro`.
    const PI_RO_ROOT: &str = "\
21 1 179:2 / / rw,noatime shared:1 - ext4 /dev/root ro,errors=remount-ro
22 21 0:5 / /dev rw,relatime shared:2 - devtmpfs devtmpfs rw,size=1800420k,nr_inodes=450105,mode=755
27 21 179:1 / /boot/firmware rw,relatime shared:11 - vfat /dev/mmcblk0p1 rw,fmask=0022,dmask=0022
40 21 0:37 / /mnt/usb\\040disk rw,relatime shared:20 - ext4 /dev/sda1 rw
";

    #[test]
    fn fields_and_read_only_from_either_option_set() {
        let mounts = parse_mountinfo(PI_RO_ROOT).unwrap();
        assert_eq!(mounts.len(), 4);
        assert_eq!(
            mounts[0],
            Mount {
                mount_point: "/".into(),
                fs_type: "ext4".into(),
                source: "/dev/root".into(),
                read_only: true,
            }
        );
        assert!(!mounts[1].read_only);
        assert_eq!(mounts[3].mount_point, PathBuf::from("/mnt/usb disk"));
        let per_mount_ro = "30 21 0:40 / /data ro,relatime - xfs /dev/sdb rw\n";
        assert!(parse_mountinfo(per_mount_ro).unwrap()[0].read_only);
    }

    #[test]
    fn the_longest_and_latest_mount_holds_a_path() {
        let text = "\
21 1 179:2 / / rw - ext4 /dev/root rw
30 21 0:40 / /var/lib rw - ext4 /dev/sda1 rw
31 21 0:41 / /var/lib rw - ext4 /dev/sda2 ro
32 21 0:42 / /var/library rw - tmpfs tmpfs rw
";
        let mounts = parse_mountinfo(text).unwrap();
        let at = |p: &str| mount_of(&mounts, Path::new(p)).map(|m| m.source.as_str());
        assert_eq!(at("/var/lib/kubelet"), Some("/dev/sda2"));
        assert_eq!(at("/var/lib"), Some("/dev/sda2"));
        assert_eq!(at("/var/libx"), Some("/dev/root"));
        assert_eq!(at("/etc"), Some("/dev/root"));
        assert_eq!(mount_of(&[], Path::new("/")), None);
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "21 1 179:2 / /",
            "21 1 179:2 / / rw shared:1 ext4 /dev/root rw",
        ] {
            assert_eq!(
                parse_mountinfo(bad),
                Err(ParseError::Invalid {
                    what: "mountinfo line",
                    text: bad.into()
                }),
                "{bad}"
            );
        }
        assert_eq!(parse_mountinfo("").unwrap(), vec![]);
    }

    #[test]
    fn escapes_decode_and_odd_backslashes_stay() {
        assert_eq!(unescape(r"a\040b\011c\134d"), "a b\tc\\d");
        assert_eq!(unescape(r"a\9b\0"), r"a\9b\0");
    }
}
