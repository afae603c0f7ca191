//! The image: charts/image/build.sh builds it with buildah (a quick `--profile dev` build here),
//! and the OCI archive it writes is opened the way a runtime does (index.json → manifest →
//! config and layer) and checked: the reference is the chart's default image, the config is
//! the Dockerfile's final stage (entrypoint, user, environment, labels), the layer holds
//! exactly the two binaries, both static (no ELF interpreter), and both run from the layer
//! alone: in a chroot of nothing but the layer, as the image's user.
//!
//! Skipped, with the reason printed, when buildah is missing or cannot build here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use libtest_mimic::{Failed, Trial};
use serde_json::{Value, json};

use knic_e2e::image::{repo, run};

/// The Dockerfile's final stage as an image config: what build.sh must reproduce.
fn dockerfile_config() -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(repo().join("charts/image/Dockerfile"))?;
    let stage = text
        .rsplit_once("\nFROM scratch\n")
        .context("the Dockerfile has no final `FROM scratch` stage")?
        .1;
    let mut args = BTreeMap::new();
    let mut env = Vec::new();
    let mut labels = serde_json::Map::new();
    let mut user = Value::Null;
    let mut entrypoint = Value::Null;
    for line in stage.lines().map(str::trim) {
        let Some((instruction, rest)) = line.split_once(' ') else {
            continue;
        };
        let expand = |s: &str| {
            args.iter()
                .fold(s.to_owned(), |s, (k, v): (&String, &String)| {
                    s.replace(&format!("${{{k}}}"), v)
                })
        };
        match instruction {
            "ARG" => {
                let (k, v) = rest.split_once('=').context("ARG without a default")?;
                args.insert(k.to_owned(), v.to_owned());
            }
            "ENV" => env.push(json!(expand(rest))),
            "USER" => user = json!(rest),
            "ENTRYPOINT" => entrypoint = serde_json::from_str(rest)?,
            "LABEL" => {
                let (k, v) = rest.split_once('=').context("LABEL without =")?;
                labels.insert(k.to_owned(), json!(expand(v.trim_matches('"'))));
            }
            _ => {}
        }
    }
    Ok(json!({"Env": env, "User": user, "Entrypoint": entrypoint, "Labels": labels}))
}

/// The program header types of an ELF64 file; PT_INTERP (3) names the dynamic loader.
fn elf_segments(path: &Path) -> anyhow::Result<Vec<u32>> {
    let bytes = std::fs::read(path)?;
    ensure!(
        bytes.starts_with(b"\x7fELF\x02\x01"),
        "{} is not a little-endian ELF64 file",
        path.display()
    );
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into()?) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count)
        .map(|i| {
            let at = phoff + i * size;
            let field = bytes.get(at..at + 4).context("truncated program headers")?;
            Ok(u32::from_le_bytes(field.try_into()?))
        })
        .collect()
}

fn blob(oci: &Path, digest: &str) -> PathBuf {
    oci.join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn json_file(path: &Path) -> anyhow::Result<Value> {
    Ok(serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    )?)
}

/// The chart's default image, as Helm renders it.
fn chart_image() -> anyhow::Result<String> {
    let rendered = knic_e2e::helm::render(&json!({}), None)?;
    let deployment = rendered
        .all::<Deployment>()
        .into_iter()
        .next()
        .context("no Deployment")?;
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.image.clone())
        .context("no image")
}

fn build_and_run() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let archive = work.path().join("knic.oci.tar");
    // The target directory the helm install twin builds in too, so one builds on the other.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-build");
    let built = knic_e2e::image::build("dev", &archive, &target)?;
    let reference = built.reference.as_str();
    let want = chart_image()?;
    ensure!(
        reference == want,
        "image {reference}, the chart's default is {want}"
    );

    // index.json → manifest → config and layers, as `ctr images import` reads them.
    let oci = work.path().join("oci");
    std::fs::create_dir(&oci)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&oci))?;
    let index = json_file(&oci.join("index.json"))?;
    let manifests = index["manifests"].as_array().context("index manifests")?;
    let [entry] = manifests.as_slice() else {
        bail!("index.json has {} manifests: {index}", manifests.len());
    };
    ensure!(
        entry["annotations"]["org.opencontainers.image.ref.name"] == json!(want),
        "the archive is not named {want}: {entry}"
    );
    let manifest = json_file(&blob(&oci, entry["digest"].as_str().context("digest")?))?;
    ensure!(manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json");
    let config = json_file(&blob(
        &oci,
        manifest["config"]["digest"].as_str().context("config")?,
    ))?;
    ensure!(config["os"] == "linux" && config["architecture"] == "amd64");
    let expected = dockerfile_config()?;
    for key in ["Env", "User", "Entrypoint", "Labels"] {
        ensure!(
            config["config"][key] == expected[key],
            "config {key} is {}, the Dockerfile says {}",
            config["config"][key],
            expected[key]
        );
    }
    ensure!(config["config"]["User"] == "65532:65532");
    ensure!(config["config"]["Entrypoint"] == json!(["/usr/local/bin/knic-driver"]));
    ensure!(config["config"]["Labels"]["org.opencontainers.image.version"] == "0.1.0");

    // One layer: the two binaries, nothing else.
    let layers = manifest["layers"].as_array().context("layers")?;
    let [layer] = layers.as_slice() else {
        bail!("{} layers, want one", layers.len());
    };
    let layer = blob(&oci, layer["digest"].as_str().context("layer digest")?);
    let listing = run(Command::new("tar").arg("-tf").arg(&layer))?;
    let mut files: Vec<&str> = listing
        .lines()
        .map(|l| l.trim_start_matches("./"))
        .filter(|l| !l.ends_with('/'))
        .collect();
    files.sort();
    ensure!(
        files == ["usr/local/bin/knic-controller", "usr/local/bin/knic-driver"],
        "layer files {files:?}"
    );
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs)?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&layer)
        .arg("-C")
        .arg(&rootfs))?;
    for binary in ["knic-driver", "knic-controller"] {
        let segments = elf_segments(&rootfs.join("usr/local/bin").join(binary))?;
        ensure!(
            !segments.contains(&3),
            "{binary} has an ELF interpreter (PT_INTERP): it is not static"
        );
    }

    // Run them from the layer alone: a chroot holds nothing else (no libc, no loader).
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: running the binaries in a chroot of the layer needs root");
        return Ok(());
    }
    // Found on this PATH: the command runs with the image's environment only.
    let chroot_bin = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chroot"))
        .find(|p| p.is_file())
        .context("no chroot on PATH")?;
    let chroot = |user: &str, args: &[&str]| {
        run(Command::new(&chroot_bin)
            .arg(format!("--userspec={user}"))
            .arg(&rootfs)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin")
            .env("TMPDIR", "/tmp"))
    };
    let image_user = "65532:65532";
    let version = chroot(image_user, &["/usr/local/bin/knic-controller", "--version"])?;
    ensure!(version == "knic-controller 0.1.0\n", "{version:?}");
    let version = chroot(image_user, &["knic-driver", "--version"])?;
    ensure!(version == "knic-driver 0.1.0\n", "{version:?}");
    // A real discovery (a built-in sample tree, written to the chroot's /tmp) and its slices.
    let tmp = rootfs.join("tmp");
    std::fs::create_dir(&tmp)?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    let slices = chroot(
        image_user,
        &[
            "knic-driver",
            "inventory",
            "--sample",
            "e810-vfs",
            "--node-name",
            "node-a",
            "-o",
            "json",
        ],
    )?;
    let list: Value = serde_json::from_str(&slices).context("inventory -o json")?;
    let devices: usize = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum();
    ensure!(
        devices == 3,
        "the E810 sample has a PF and 2 VFs, published {devices}"
    );
    Ok(())
}

fn main() {
    let args = knic_e2e::harness::arguments();
    let unusable = knic_e2e::image::buildah_unusable();
    if let Some(reason) = &unusable {
        eprintln!("skipped: image/build_inspect_and_run: {reason}");
    }
    let trial = Trial::test("image/build_inspect_and_run", || {
        build_and_run().map_err(|e| Failed::from(format!("{e:#}")))
    })
    .with_ignored_flag(unusable.is_some());
    libtest_mimic::run(&args, vec![trial]).exit();
}
