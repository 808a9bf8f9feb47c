//! `ringfeed serve`: the library's file server on a directory until Ctrl-C.

use ringfeed::serve::{ServeOptions, Server};

use crate::AnyResult;
use crate::args::ServeArgs;

pub(crate) fn serve_cmd(a: ServeArgs) -> AnyResult<()> {
    // An IPv6 literal needs brackets before the port.
    let addr = if a.bind.contains(':') && !a.bind.starts_with('[') {
        format!("[{}]:{}", a.bind, a.port)
    } else {
        format!("{}:{}", a.bind, a.port)
    };
    let server = Server::bind(
        &addr,
        &a.dir,
        ServeOptions {
            max_connections: a.max_connections,
            access_log: a.log,
            ..ServeOptions::default()
        },
    )?;
    // The URL alone on stdout, for scripts; the rest on stderr.
    println!("{}", server.url());
    std::io::Write::flush(&mut std::io::stdout())?;
    let example = std::fs::read_dir(server.root())
        .ok()
        .and_then(|d| {
            let mut tars: Vec<String> = d
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".tar"))
                .collect();
            tars.sort();
            tars.into_iter().next()
        })
        .unwrap_or_else(|| "shard.tar".into());
    eprintln!(
        "serving {} on {} (Ctrl-C stops); try: ringfeed ls {}{example}",
        server.root().display(),
        server.url(),
        server.url()
    );
    loop {
        // Serves on its own threads; this one only keeps the process alive.
        std::thread::park();
    }
}
