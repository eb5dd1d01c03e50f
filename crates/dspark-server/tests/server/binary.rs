//! The `dspark-server` binary: `--help`, usage errors (exit 2), a port already taken (exit 1,
//! code `bind`), and SIGTERM mid-request (the request finishes, exit 0).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_dspark-server");

#[test]
fn help_and_usage_errors() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: dspark serve [OPTIONS]"), "{help}");
    // Every usage error is the one documented line (no clap styling), exit 2.
    for args in [
        &["--port", "x"][..],
        &["--port", "99999"],
        &["--no-such-option"],
        &["--target", "/nowhere"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("dspark serve: error [usage]: "),
            "{err}"
        );
        assert!(!err.contains('\u{1b}'), "{args:?}: styled: {err}");
    }
}

/// Start the binary on the echo engine; the child and its address (the caller waits for it).
#[allow(clippy::zombie_processes)]
fn start(
    extra: &[&str],
) -> (
    std::process::Child,
    String,
    BufReader<std::process::ChildStderr>,
) {
    let mut child = Command::new(BIN)
        .args(["--port", "0", "--fake-engine", "--fake-step-ms", "20"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the server exited before listening"
        );
        // Logs to a pipe are plain text (colour only on a terminal).
        assert!(
            !line.contains('\u{1b}'),
            "colour codes in a piped log: {line:?}"
        );
        if let Some(at) = line.find("listening on http://") {
            let addr = line[at + 20..]
                .split_whitespace()
                .next()
                .unwrap()
                .to_owned();
            return (child, addr, err);
        }
    }
}

#[cfg(unix)]
#[test]
fn sigterm_finishes_the_request_in_flight_and_exits_zero() {
    let (mut child, addr, mut err) = start(&["--shutdown-timeout", "10"]);
    let body = br#"{"prompt": [5, 6, 7], "max_tokens": 30, "ignore_eos": true}"#;
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"finish_reason\":\"length\""), "{answer}");
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("stopped"), "{rest}");

    // A port already taken: exit 1 with code `bind`.
    let (mut first, addr, _e) = start(&[]);
    let port = addr.rsplit(':').next().unwrap();
    let out = Command::new(BIN)
        .args(["--fake-engine", "--port", port])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[bind]"));
    first.kill().unwrap();
    let _ = first.wait();
}
