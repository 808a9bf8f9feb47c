//! The tests of `volume.rs`: what a publish becomes, and every refusal
//! with its code and the name it gives.
use super::super::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};
use super::*;

fn cap(mode: Mode, flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
        })),
    }
}

fn ctx(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn publish(
    c: &VolumeCapability,
    context: &HashMap<String, String>,
    readonly: bool,
) -> Result<Plan, Refusal> {
    let node = Node {
        cache_dir: Some(PathBuf::from("/nvme/cache")),
    };
    plan(
        &Publish {
            volume_id: "vol-1",
            target_path: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
            capability: Some(c),
            readonly,
            context,
        },
        &node,
    )
}

fn refused(r: Result<Plan, Refusal>, code: Code, want: &str) {
    let e = r.expect_err("accepted");
    assert_eq!(e.code, code, "{}", e.message);
    assert!(e.message.contains(want), "`{want}` not in: {}", e.message);
}

#[test]
fn attributes_and_mount_options_become_the_mount_s_flags() {
    let c = cap(
        Mode::MultiNodeMultiWriter,
        &["uid=1000", "--part-size=16MiB", "allow-other"],
    );
    let p = publish(
        &c,
        &ctx(&[
            ("source", "s3://bucket/train/"),
            ("region", "eu-west-1"),
            ("endpointUrl", "http://127.0.0.1:9000"),
            ("pathStyle", "true"),
            ("gid", "100"),
            ("fileMode", "0640"),
            ("csi.storage.k8s.io/pod.name", "trainer-0"),
        ]),
        false,
    )
    .unwrap();
    assert_eq!(
        p.args,
        [
            "mount",
            "s3://bucket/train/",
            "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
            "--allow-other",
            "--endpoint-url=http://127.0.0.1:9000",
            "--file-mode=0640",
            "--gid=100",
            "--part-size=16MiB",
            "--region=eu-west-1",
            "--s3-path-style",
            "--uid=1000",
            "--cache-dir=/nvme/cache",
        ]
    );
    assert!(!p.read_only);
    assert_eq!(
        serde_json::Value::Object(p.config),
        json!({"s3_region": "eu-west-1", "s3_endpoint": "http://127.0.0.1:9000", "s3_path_style": true})
    );
}

#[test]
fn read_only_comes_from_the_kubelet_the_mode_the_attribute_the_option_or_the_source() {
    let rw = cap(Mode::SingleNodeWriter, &[]);
    let s3 = ctx(&[("source", "s3://b/p/")]);
    assert!(!publish(&rw, &s3, false).unwrap().read_only);
    // The control above: each of these alone makes it read-only.
    assert!(publish(&rw, &s3, true).unwrap().read_only);
    assert!(
        publish(&cap(Mode::MultiNodeReaderOnly, &[]), &s3, false)
            .unwrap()
            .read_only
    );
    assert!(
        publish(&cap(Mode::SingleNodeWriter, &["ro"]), &s3, false)
            .unwrap()
            .read_only
    );
    let ro = ctx(&[("source", "s3://b/p/"), ("access", "read-only")]);
    let p = publish(&rw, &ro, false).unwrap();
    assert!(p.read_only && p.args.contains(&"--read-only".to_string()));
    for source in ["https://h/d/", "hf://datasets/o/n"] {
        assert!(
            publish(&rw, &ctx(&[("source", source)]), false)
                .unwrap()
                .read_only
        );
    }
    let none = ctx(&[("source", "s3://b/p/"), ("cache", "none")]);
    assert!(
        !publish(&rw, &none, false)
            .unwrap()
            .args
            .iter()
            .any(|a| a.starts_with("--cache-dir"))
    );
}

#[test]
fn bad_attributes_are_refused_by_name() {
    let c = cap(Mode::SingleNodeWriter, &[]);
    type Case<'a> = (&'a [(&'a str, &'a str)], Code, &'a str);
    let cases: &[Case] = &[
        (&[], Code::InvalidArgument, "`source` is required"),
        (
            &[("source", "/data")],
            Code::InvalidArgument,
            "`source` `/data`",
        ),
        (
            &[("source", "s3:///k")],
            Code::InvalidArgument,
            "names no bucket",
        ),
        (
            &[("source", "hf://")],
            Code::InvalidArgument,
            "names no dataset",
        ),
        (&[("source", "s3://b/ x")], Code::InvalidArgument, "a space"),
        (
            &[("source", "s3://b/"), ("bucket", "x")],
            Code::InvalidArgument,
            "unknown volume attribute `bucket`",
        ),
        (
            &[("source", "s3://b/"), ("uid", "-1")],
            Code::InvalidArgument,
            "`uid`: `-1`",
        ),
        (
            &[("source", "s3://b/"), ("uid", "99999999999")],
            Code::InvalidArgument,
            "`uid`",
        ),
        (
            &[("source", "s3://b/"), ("fileMode", "0999")],
            Code::InvalidArgument,
            "`fileMode`",
        ),
        (
            &[("source", "s3://b/"), ("dirMode", "1777")],
            Code::InvalidArgument,
            "`dirMode`",
        ),
        (
            &[("source", "s3://b/"), ("pathStyle", "yes")],
            Code::InvalidArgument,
            "`pathStyle`: `yes`",
        ),
        (
            &[("source", "s3://b/"), ("access", "rw")],
            Code::InvalidArgument,
            "`access`: `rw`",
        ),
        (
            &[("source", "s3://b/"), ("cache", "disk")],
            Code::InvalidArgument,
            "`cache`: `disk`",
        ),
        (
            &[("source", "s3://b/"), ("endpointUrl", "ftp://x")],
            Code::InvalidArgument,
            "`endpointUrl`",
        ),
        (
            &[("source", "s3://b/"), ("region", "")],
            Code::InvalidArgument,
            "`region`",
        ),
        (
            &[("source", "https://h/d/"), ("access", "write-once")],
            Code::InvalidArgument,
            "`access`: write-once",
        ),
        (
            &[
                ("source", "s3://b/"),
                ("csi.storage.k8s.io/ephemeral", "true"),
            ],
            Code::InvalidArgument,
            "ephemeral",
        ),
    ];
    for (kv, code, want) in cases {
        refused(publish(&c, &ctx(kv), false), *code, want);
    }
    let no_cache = plan(
        &Publish {
            volume_id: "v",
            target_path: "/t/x",
            capability: Some(&c),
            readonly: false,
            context: &ctx(&[("source", "s3://b/"), ("cache", "node")]),
        },
        &Node::default(),
    );
    refused(no_cache, Code::FailedPrecondition, "without --cache-dir");
}

#[test]
fn mount_options_outside_the_allow_list_or_with_bad_values_are_refused_by_name() {
    let s3 = ctx(&[("source", "s3://b/")]);
    let cases: &[(&str, &str)] = &[
        ("cache-dir=/tmp", "mount option `cache-dir` is not allowed"),
        (
            "--config={\"s3_secret_key\":\"x\"}",
            "mount option `config` is not allowed",
        ),
        ("daemon", "mount option `daemon` is not allowed"),
        (
            "metrics-port=9000",
            "mount option `metrics-port` is not allowed",
        ),
        ("", "an empty mount option"),
        ("--", "an empty mount option"),
        ("uid", "--uid needs a value"),
        ("read-only=yes", "--read-only takes no value"),
        ("part-size=lots", "mount option `part-size=lots`"),
        ("part-size=1KiB", "mount option `part-size=1KiB`"),
        ("parts-in-flight=0", "mount option `parts-in-flight=0`"),
        ("memory=-5", "`-5` is not a size"),
        ("metadata-ttl=NaN", "not a number of seconds"),
        ("threads=100000", "not a thread count"),
        ("uid=1\n--daemon", "control character"),
    ];
    for (opt, want) in cases {
        refused(
            publish(&cap(Mode::SingleNodeWriter, &[opt]), &s3, false),
            Code::InvalidArgument,
            want,
        );
    }
    // The same flag from two places with two values names both.
    let both = ctx(&[("source", "s3://b/"), ("uid", "1")]);
    refused(
        publish(&cap(Mode::SingleNodeWriter, &["uid=2"]), &both, false),
        Code::InvalidArgument,
        "volume attribute `uid` and mount option `uid=2` disagree",
    );
    // The same value twice is one setting; `name value` and aliases are taken.
    let same = ctx(&[("source", "s3://b/"), ("uid", "1")]);
    let p = publish(
        &cap(
            Mode::SingleNodeWriter,
            &["uid 1", "force-path-style", "--s3-region=x-1"],
        ),
        &same,
        false,
    )
    .unwrap();
    assert!(p.args.contains(&"--uid=1".to_string()), "{:?}", p.args);
    assert!(
        p.args.contains(&"--s3-path-style".to_string()),
        "{:?}",
        p.args
    );
    assert!(p.args.contains(&"--region=x-1".to_string()), "{:?}", p.args);
}

#[test]
fn bad_capabilities_volume_ids_and_target_paths_are_refused_by_name() {
    let s3 = ctx(&[("source", "s3://b/")]);
    let block = VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(BlockVolume {})),
    };
    refused(
        publish(&block, &s3, false),
        Code::FailedPrecondition,
        "block access",
    );
    let mut no_type = cap(Mode::SingleNodeWriter, &[]);
    no_type.access_type = None;
    refused(
        publish(&no_type, &s3, false),
        Code::InvalidArgument,
        "access_type",
    );
    let mut no_mode = cap(Mode::SingleNodeWriter, &[]);
    no_mode.access_mode = None;
    refused(
        publish(&no_mode, &s3, false),
        Code::InvalidArgument,
        "access_mode` is required",
    );
    for mode in [0, 6, -3, i32::MAX] {
        let mut c = cap(Mode::SingleNodeWriter, &[]);
        c.access_mode = Some(AccessMode { mode });
        refused(
            publish(&c, &s3, false),
            Code::InvalidArgument,
            &format!("access_mode` {mode}"),
        );
    }
    let mut ext4 = cap(Mode::SingleNodeWriter, &[]);
    if let Some(AccessType::Mount(m)) = &mut ext4.access_type {
        m.fs_type = "ext4".into();
    }
    refused(
        publish(&ext4, &s3, false),
        Code::InvalidArgument,
        "fs_type` `ext4`",
    );

    for (id, want) in [
        ("", "`volume_id` is required"),
        ("a\u{0}b", "control character"),
    ] {
        refused(
            volume_id(id).map(|_| unreachable!()),
            Code::InvalidArgument,
            want,
        );
    }
    refused(
        volume_id(&"v".repeat(129)).map(|_| unreachable!()),
        Code::InvalidArgument,
        "past the CSI bound",
    );
    assert!(volume_id(&"v".repeat(128)).is_ok());
    for (t, want) in [
        ("", "`target_path` is required"),
        ("relative/mount", "not an absolute path"),
        ("/var/lib/../etc", "`..`"),
        ("/var/./lib", "`.`"),
        ("/", "is `/`"),
        ("/a\u{0}b", "control character"),
    ] {
        refused(
            target_path(t).map(|_| unreachable!()),
            Code::InvalidArgument,
            want,
        );
    }
    refused(
        target_path(&format!("/{}", "x".repeat(5000))).map(|_| unreachable!()),
        Code::InvalidArgument,
        "PATH_MAX",
    );
    let big: HashMap<String, String> = (0..40)
        .map(|i| (format!("k{i}"), "v".repeat(120)))
        .chain([("source".to_string(), "s3://b/".to_string())])
        .collect();
    refused(
        publish(&cap(Mode::SingleNodeWriter, &[]), &big, false),
        Code::InvalidArgument,
        "past the CSI bound of 4096",
    );
}
