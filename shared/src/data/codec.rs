//! Decoders the public layouts need: LiveCodeBench's compressed test blobs and the reversal of
//! a unified diff (SWE-smith's patches introduce the bug; the fix is their reverse).

use std::io::Read;

use base64::Engine;

/// Decodes LiveCodeBench's `private_test_cases` when it is `base64(zlib(pickle(str)))`: the
/// pickle must hold exactly one string (the JSON of the test cases), which is returned. Other
/// pickles are refused rather than interpreted.
pub fn decode_lcb_blob(text: &str) -> Result<String, String> {
    let compressed = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("not JSON and not base64: {e}"))?;
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(compressed.as_slice())
        .take(1 << 30)
        .read_to_end(&mut raw)
        .map_err(|e| format!("base64 but not zlib data: {e}"))?;
    unpickle_string(&raw)
}

/// The string a pickle holds, for the subset of the protocol that pickles a lone `str`
/// (`PROTO`, `FRAME`, `SHORT_BINUNICODE` / `BINUNICODE` / `BINUNICODE8`, `MEMOIZE` / `BINPUT`,
/// `STOP`).
pub fn unpickle_string(data: &[u8]) -> Result<String, String> {
    let mut pos = 0usize;
    let mut out: Option<String> = None;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = pos.checked_add(n).filter(|&e| e <= data.len());
        let end = end.ok_or_else(|| "pickle ends early".to_string())?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    };
    let le = |b: &[u8]| {
        b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
    };
    loop {
        let op = *take(&mut pos, 1)?.first().unwrap_or(&0);
        match op {
            0x80 => {
                take(&mut pos, 1)?;
            }
            0x95 => {
                take(&mut pos, 8)?;
            }
            0x94 => {}
            b'q' => {
                take(&mut pos, 1)?;
            }
            0x8c | b'X' | 0x8d => {
                if out.is_some() {
                    return Err("pickle holds more than one string".into());
                }
                let width = match op {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                };
                let n = le(take(&mut pos, width)?) as usize;
                let bytes = take(&mut pos, n)?;
                let s = std::str::from_utf8(bytes)
                    .map_err(|e| format!("pickled string is not UTF-8: {e}"))?;
                out = Some(s.to_string());
            }
            b'.' => return out.ok_or_else(|| "pickle holds no string".into()),
            other => {
                return Err(format!(
                    "pickle holds more than a string (opcode 0x{other:02x}); only a pickled JSON \
                     string is decoded"
                ))
            }
        }
    }
}

/// The reverse of a unified diff (what undoes it): old and new file names swapped, hunk ranges
/// swapped, `-` and `+` lines swapped, and in each run of changed lines the removals put first
/// again, as diff tools write them. `None` when `patch` is not a unified diff.
pub fn reverse_patch(patch: &str) -> Option<String> {
    let mut out = String::with_capacity(patch.len());
    let mut saw_hunk = false;
    let mut removed: Vec<&str> = Vec::new();
    let mut added: Vec<&str> = Vec::new();
    // Writes a run of changed lines reversed: the original's additions as removals, first.
    let flush = |out: &mut String, added: &mut Vec<&str>, removed: &mut Vec<&str>| {
        for l in added.drain(..) {
            out.push('-');
            out.push_str(l);
        }
        for l in removed.drain(..) {
            out.push('+');
            out.push_str(l);
        }
    };
    let lines: Vec<&str> = patch.split_inclusive('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("--- ") && lines.get(i + 1).is_some_and(|n| n.starts_with("+++ ")) {
            flush(&mut out, &mut added, &mut removed);
            let old = &line[4..];
            let new = &lines[i + 1][4..];
            out.push_str("--- ");
            out.push_str(&swap_prefix(new, "b/", "a/"));
            out.push_str("+++ ");
            out.push_str(&swap_prefix(old, "a/", "b/"));
            i += 2;
            continue;
        }
        if let Some(rest) = line.strip_prefix("@@ -") {
            flush(&mut out, &mut added, &mut removed);
            let (ranges, tail) = rest.split_once(" @@")?;
            let (old, new) = ranges.split_once(" +")?;
            out.push_str(&format!("@@ -{new} +{old} @@{tail}"));
            saw_hunk = true;
        } else if let Some(l) = line.strip_prefix('+') {
            added.push(l);
            i += 1;
            continue;
        } else if let Some(l) = line.strip_prefix('-') {
            removed.push(l);
            i += 1;
            continue;
        } else {
            flush(&mut out, &mut added, &mut removed);
            if let Some(mode) = line.strip_prefix("new file mode ") {
                out.push_str("deleted file mode ");
                out.push_str(mode);
            } else if let Some(mode) = line.strip_prefix("deleted file mode ") {
                out.push_str("new file mode ");
                out.push_str(mode);
            } else if let Some(idx) = line.strip_prefix("index ") {
                match idx.split_once("..") {
                    Some((a, rest)) => {
                        let (b, mode) = rest.split_at(rest.find([' ', '\n']).unwrap_or(rest.len()));
                        out.push_str(&format!("index {b}..{a}{mode}"));
                    }
                    None => out.push_str(line),
                }
            } else if let Some(rest) = line.strip_prefix("diff --git a/") {
                match rest.split_once(" b/") {
                    Some((a, b)) => {
                        let (b, nl) = b.split_at(b.trim_end_matches('\n').len());
                        out.push_str(&format!("diff --git a/{b} b/{a}{nl}"));
                    }
                    None => out.push_str(line),
                }
            } else {
                out.push_str(line);
            }
            i += 1;
            continue;
        }
        i += 1;
    }
    flush(&mut out, &mut added, &mut removed);
    saw_hunk.then_some(out)
}

fn swap_prefix(name: &str, from: &str, to: &str) -> String {
    match name.strip_prefix(from) {
        Some(rest) => format!("{to}{rest}"),
        None => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// `pickle.dumps("[1]")` with protocol 4 (what LiveCodeBench's script writes).
    const PICKLED: &[u8] = b"\x80\x04\x95\x07\x00\x00\x00\x00\x00\x00\x00\x8c\x03[1]\x94.";

    #[test]
    fn lcb_blobs_decode_and_other_pickles_are_refused() {
        assert_eq!(unpickle_string(PICKLED).unwrap(), "[1]");
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(PICKLED).unwrap();
        let blob = base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap());
        assert_eq!(decode_lcb_blob(&blob).unwrap(), "[1]");
        // pickle.dumps([1]) : a list, not a string.
        let e = unpickle_string(b"\x80\x04\x95\x07\x00\x00\x00\x00\x00\x00\x00]\x94K\x01a.")
            .unwrap_err();
        assert!(e.contains("opcode 0x5d"), "{e}");
        assert!(decode_lcb_blob("@@@").unwrap_err().contains("base64"));
    }

    #[test]
    fn a_reversed_patch_undoes_the_original() {
        let bug = "diff --git a/m.py b/m.py\nindex 1111111..2222222 100644\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x + 1\n+    return x - 1\n \n";
        let fix = reverse_patch(bug).unwrap();
        assert_eq!(
            fix,
            "diff --git a/m.py b/m.py\nindex 2222222..1111111 100644\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x - 1\n+    return x + 1\n \n"
        );
        assert_eq!(reverse_patch(&fix).unwrap(), bug);
        assert!(reverse_patch("not a diff").is_none());
    }
}
