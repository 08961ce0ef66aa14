//! What is inside each released binary, read two ways that must agree: the crates the binary
//! carries itself (`cargo auditable`, section `.dep-v0`, read back by `auditable2cdx`, the
//! cargo-auditable project's own reader, as trivy, grype and syft read it) and the CycloneDX
//! SBOM `scripts/sbom.sh` writes for it with cargo-cyclonedx. Every crate linked into the
//! binary is in its SBOM with a license and a purl, and the SBOM lists nothing the build did
//! not use.
//!
//! Needs the binaries and SBOMs (`EDGEBEAT_SBOMS`: `<binary> <sbom>` pairs, one per line, as
//! `scripts/sbom.sh` prints them) and auditable2cdx (`EDGEBEAT_AUDITABLE2CDX`):
//! `scripts/test.sh` makes them and runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use edgebeat_tests::process::output;
use serde_json::Value;

/// `(name, version)` of the root component and every component of `bom`; with `linked`,
/// less those marked build-time (`cdx:rustc:dependency_kind` = `build`: build scripts,
/// proc macros and what they use, run by cargo and never linked).
fn crates(bom: &Value, linked: bool) -> BTreeSet<(String, String)> {
    let pair = |c: &Value| {
        (
            c["name"].as_str().unwrap_or_default().to_owned(),
            c["version"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let build = |c: &Value| {
        c["properties"].as_array().is_some_and(|p| {
            p.iter()
                .any(|p| p["name"] == "cdx:rustc:dependency_kind" && p["value"] == "build")
        })
    };
    let mut all: BTreeSet<_> = bom["components"]
        .as_array()
        .expect("components")
        .iter()
        .filter(|c| !linked || !build(c))
        .map(pair)
        .collect();
    all.insert(pair(&bom["metadata"]["component"]));
    all
}

#[test]
#[ignore = "needs the release binaries, their SBOMs and auditable2cdx (scripts/test.sh)"]
fn each_release_binary_carries_its_crates_and_its_sbom_lists_them_all() {
    let pairs = std::env::var("EDGEBEAT_SBOMS").expect("EDGEBEAT_SBOMS");
    let reader = std::env::var("EDGEBEAT_AUDITABLE2CDX").expect("EDGEBEAT_AUDITABLE2CDX");
    let mut checked = 0;
    for line in pairs.lines().filter(|l| !l.trim().is_empty()) {
        let (binary, sbom) = line.split_once(' ').expect("<binary> <sbom>");
        let name = Path::new(binary).file_name().unwrap().to_string_lossy();
        let out = output(Command::new(&reader).arg(binary)).unwrap();
        assert!(
            out.status.success(),
            "{binary}: no crates embedded (built without cargo auditable?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let embedded: Value = serde_json::from_slice(&out.stdout).unwrap();
        let bom: Value = serde_json::from_str(&std::fs::read_to_string(sbom).unwrap()).unwrap();
        assert_eq!(bom["bomFormat"], "CycloneDX", "{sbom}");
        assert_eq!(bom["specVersion"], "1.5", "{sbom}");
        assert_eq!(bom["metadata"]["component"]["name"], *name, "{sbom}");
        // Every crate linked into the binary is in the SBOM; the SBOM names nothing the
        // build did not use (beyond the linked ones: proc macros, which cargo-cyclonedx
        // counts as the crate's own dependencies and cargo auditable as build-time).
        let in_binary = crates(&embedded, true);
        let built_with = crates(&embedded, false);
        let listed = crates(&bom, false);
        let missing: Vec<_> = in_binary.difference(&listed).collect();
        let extra: Vec<_> = listed.difference(&built_with).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{binary} against {sbom}:\n linked in, not in the SBOM: {missing:?}\n in the SBOM, not in the build: {extra:?}"
        );
        for c in bom["components"].as_array().unwrap() {
            assert!(
                c["licenses"].as_array().is_some_and(|l| !l.is_empty()),
                "{sbom}: {} has no license",
                c["name"]
            );
            assert!(
                c["purl"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("pkg:cargo/")),
                "{sbom}: {} has no purl",
                c["name"]
            );
        }
        println!(
            "{binary}: {} crates linked in, all of them among the {} of {sbom}",
            in_binary.len(),
            listed.len()
        );
        checked += 1;
    }
    assert_eq!(
        checked, 5,
        "the agent for three targets, the gateway for two"
    );
}
