//! `ringfeed csi --check-volume FILE`: a PersistentVolume checked as the
//! driver checks a publish of it, before it is applied — its driver name,
//! its access modes and mount options as the kubelet hands them over, its
//! volume attributes — with the `ringfeed mount` command it becomes
//! printed, or the refusal with its CSI code. The same code as a publish
//! (`volume::plan`), so what passes here is what the driver accepts.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use serde_json::Value;

use super::proto::VolumeCapability;
use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use super::service::DRIVER_NAME;
use super::volume::{self, Node, Publish};
use crate::AnyResult;

/// The access mode the kubelet sends for a PersistentVolume's
/// `accessModes` (the most permissive first, as its CSI client picks).
fn access_mode(modes: &[&str]) -> Result<Mode, String> {
    for (k8s, csi) in [
        ("ReadWriteMany", Mode::MultiNodeMultiWriter),
        ("ReadOnlyMany", Mode::MultiNodeReaderOnly),
        ("ReadWriteOnce", Mode::SingleNodeWriter),
    ] {
        if modes.contains(&k8s) {
            return Ok(csi);
        }
    }
    match modes {
        [] => Err("`spec.accessModes` is empty".into()),
        _ => Err(format!(
            "`spec.accessModes` {modes:?}: none this driver serves (ReadWriteMany, \
             ReadOnlyMany, ReadWriteOnce; ReadWriteOncePod needs a CSI spec newer than v1.3.0)"
        )),
    }
}

/// The publish the kubelet would send for the PersistentVolume `pv`, with
/// its volume context; or what in `pv` keeps it from being one of ours.
fn publish_of(
    pv: &Value,
) -> Result<(String, VolumeCapability, bool, HashMap<String, String>), String> {
    let kind = pv.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind != "PersistentVolume" {
        return Err(format!("a PersistentVolume is checked, not a `{kind}`"));
    }
    let spec = pv.get("spec").ok_or("`spec` is missing")?;
    let csi = spec
        .get("csi")
        .ok_or("`spec.csi` is missing: not a CSI volume")?;
    let driver = csi.get("driver").and_then(Value::as_str).unwrap_or("");
    if driver != DRIVER_NAME {
        return Err(format!(
            "`spec.csi.driver` is `{driver}`, not `{DRIVER_NAME}`"
        ));
    }
    let handle = csi
        .get("volumeHandle")
        .and_then(Value::as_str)
        .ok_or("`spec.csi.volumeHandle` is missing")?;
    let strings = |v: Option<&Value>, what: &str| -> Result<Vec<String>, String> {
        match v {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_owned)
                        .ok_or(format!("`{what}` holds a non-string"))
                })
                .collect(),
            Some(_) => Err(format!("`{what}` is not a list")),
        }
    };
    let modes = strings(spec.get("accessModes"), "spec.accessModes")?;
    let modes: Vec<&str> = modes.iter().map(String::as_str).collect();
    let mode = access_mode(&modes)?;
    let flags = strings(spec.get("mountOptions"), "spec.mountOptions")?;
    if spec.get("volumeMode").and_then(Value::as_str) == Some("Block") {
        return Err("`spec.volumeMode` is Block: a ringfeed volume is a file system".into());
    }
    let mut context = HashMap::new();
    if let Some(attrs) = csi.get("volumeAttributes") {
        let attrs = attrs
            .as_object()
            .ok_or("`spec.csi.volumeAttributes` is not a map")?;
        for (k, v) in attrs {
            let v = v
                .as_str()
                .ok_or(format!("volume attribute `{k}` is not a string (quote it)"))?;
            context.insert(k.clone(), v.to_owned());
        }
    }
    let readonly = csi
        .get("readOnly")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cap = VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: csi
                .get("fsType")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            mount_flags: flags,
        })),
    };
    Ok((handle.to_owned(), cap, readonly, context))
}

/// Prints the mount a publish of the PersistentVolume in `file` becomes,
/// or fails naming why the driver would refuse it.
pub(crate) fn check_volume(file: &Path, cache_dir: Option<&Path>) -> AnyResult<()> {
    let mut text = String::new();
    if file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut text)?;
    } else {
        text = std::fs::read_to_string(file).map_err(|e| format!("`{}`: {e}", file.display()))?;
    }
    let pv: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "`{}` is not JSON ({e}): give `kubectl get pv NAME -o json`",
            file.display()
        )
    })?;
    let name = pv
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let (handle, cap, readonly, context) =
        publish_of(&pv).map_err(|e| format!("PersistentVolume `{name}`: {e}"))?;
    // Where the kubelet would publish it for a pod (any pod: the target
    // takes no part in the checks but its form).
    let target = format!("/var/lib/kubelet/pods/check/volumes/kubernetes.io~csi/{name}/mount");
    let publish = Publish {
        volume_id: &handle,
        target_path: &target,
        capability: Some(&cap),
        readonly,
        context: &context,
    };
    let node = Node {
        cache_dir: cache_dir.map(Path::to_path_buf),
    };
    match volume::plan(&publish, &node) {
        Ok(plan) => {
            println!(
                "PersistentVolume `{name}`: accepted{}: ringfeed {}",
                if plan.read_only {
                    " (read-only)"
                } else {
                    " (write-once)"
                },
                plan.args.join(" ")
            );
            Ok(())
        }
        Err(r) => Err(format!(
            "PersistentVolume `{name}`: refused ({:?}): {}",
            r.code, r.message
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_access_mode_is_the_most_permissive_of_the_volumes() {
        assert_eq!(
            access_mode(&["ReadOnlyMany"]),
            Ok(Mode::MultiNodeReaderOnly)
        );
        assert_eq!(
            access_mode(&["ReadWriteOnce", "ReadWriteMany"]),
            Ok(Mode::MultiNodeMultiWriter)
        );
        assert!(access_mode(&[]).unwrap_err().contains("empty"));
        assert!(
            access_mode(&["ReadWriteOncePod"])
                .unwrap_err()
                .contains("v1.3.0")
        );
    }
}
