//! Go architecture names, as kubelet reports them.

/// The Go `GOARCH` name for a Rust `target_arch` (`std::env::consts::ARCH`), which is what
/// kubelet puts in `nodeInfo.architecture` and the `kubernetes.io/arch` label (kubelet
/// `pkg/kubelet/nodestatus/setters.go: GoRuntime`, which uses `runtime.GOARCH`).
///
/// `x86_64`→`amd64`, `x86`→`386`, `aarch64`→`arm64`, `loongarch64`→`loong64`,
/// `powerpc64`→`ppc64le`/`ppc64` and `mips`/`mips64`→`…le` by endianness; anything else
/// (`arm`, `s390x`, `riscv64`…) passes through unchanged.
pub fn go_arch(rust_arch: &'static str, little_endian: bool) -> &'static str {
    match (rust_arch, little_endian) {
        ("x86_64", _) => "amd64",
        ("x86", _) => "386",
        ("aarch64", _) => "arm64",
        ("loongarch64", _) => "loong64",
        ("powerpc64", true) => "ppc64le",
        ("powerpc64", false) => "ppc64",
        ("mips", true) => "mipsle",
        ("mips64", true) => "mips64le",
        (other, _) => other,
    }
}

/// [`go_arch`] of the architecture this binary was built for.
pub fn host_go_arch() -> &'static str {
    go_arch(std::env::consts::ARCH, cfg!(target_endian = "little"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_arch_table() {
        let cases = [
            ("x86_64", true, "amd64"),
            ("x86", true, "386"),
            ("aarch64", true, "arm64"),
            ("arm", true, "arm"),
            ("powerpc64", true, "ppc64le"),
            ("powerpc64", false, "ppc64"),
            ("s390x", false, "s390x"),
            ("riscv64", true, "riscv64"),
            ("loongarch64", true, "loong64"),
            ("mips", true, "mipsle"),
            ("mips", false, "mips"),
            ("mips64", true, "mips64le"),
            ("sparc64", false, "sparc64"),
        ];
        for (arch, le, want) in cases {
            assert_eq!(go_arch(arch, le), want, "{arch} le={le}");
        }
    }
}
