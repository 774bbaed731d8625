//! The HTML side of the report: escaping, number formatting, and the [`Writer`] that collects
//! the page's sections and writes its SVG charts.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::ReportError;

/// HTML-escapes text for element content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Compact number: up to 4 decimals, trailing zeros trimmed; integers above
/// 1000 without decimals.
pub(crate) fn num(x: f64) -> String {
    if !x.is_finite() {
        return "—".to_string();
    }
    if x.abs() >= 1000.0 {
        return format!("{x:.0}");
    }
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// `x` as text, or "—" when absent.
pub(crate) fn opt_text<T: std::fmt::Display>(x: Option<T>) -> String {
    x.map(|x| x.to_string()).unwrap_or_else(|| "—".to_string())
}

pub(crate) fn opt_num(x: Option<f64>) -> String {
    x.map(num).unwrap_or_else(|| "—".to_string())
}

pub(crate) fn pct(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map(|x| format!("{:.1}%", x * 100.0))
        .unwrap_or_else(|| "—".to_string())
}

pub(crate) fn duration(s: f64) -> String {
    if !s.is_finite() {
        return "—".to_string();
    }
    let total = s.round().max(0.0) as u64;
    let (h, m, sec) = (total / 3600, (total / 60) % 60, total % 60);
    let hms = if h > 0 {
        format!("{h}h {m:02}m {sec:02}s")
    } else if m > 0 {
        format!("{m}m {sec:02}s")
    } else {
        format!("{sec}s")
    };
    format!("{} s ({hms})", num(s))
}

pub(crate) fn json_value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => a.len().to_string(),
        other => other.to_string(),
    }
}

pub(crate) const CHART_NAMES: [&str; 9] = [
    "reward",
    "pass_rate",
    "response_len",
    "throughput",
    "policy_lag",
    "loss",
    "rm",
    "compare_reward",
    "actor_tokens",
];

pub(crate) struct Writer {
    pub(crate) out_dir: PathBuf,
    pub(crate) html: String,
    pub(crate) charts: Vec<PathBuf>,
}

impl Writer {
    pub(crate) fn section(&mut self, id: &str, title: &str) {
        let _ = write!(
            self.html,
            "<section id=\"{id}\">\n<h2>{}</h2>\n",
            esc(title)
        );
    }

    pub(crate) fn end_section(&mut self) {
        self.html.push_str("</section>\n");
    }

    pub(crate) fn empty(&mut self, text: &str) {
        let _ = writeln!(self.html, "<p class=\"empty\">{}</p>", esc(text));
    }

    /// Writes `name.svg` and links it, or notes that there was nothing to plot.
    pub(crate) fn chart(
        &mut self,
        name: &str,
        alt: &str,
        svg: Result<Option<String>, String>,
    ) -> Result<(), ReportError> {
        let svg = svg.map_err(|message| ReportError::Chart {
            name: name.to_string(),
            message,
        })?;
        match svg {
            Some(svg) => {
                let file = format!("{name}.svg");
                let path = self.out_dir.join(&file);
                std::fs::write(&path, svg).map_err(|source| ReportError::Io {
                    path: path.clone(),
                    source,
                })?;
                self.charts.push(path);
                let _ = writeln!(
                    self.html,
                    "<figure><img src=\"{file}\" alt=\"{}\"></figure>",
                    esc(alt)
                );
            }
            None => self.empty(&format!("{alt}: no data.")),
        }
        Ok(())
    }
}

pub(crate) const STYLE: &str =
    "body{font-family:sans-serif;max-width:960px;margin:2em auto;color:#222}\
table{border-collapse:collapse;margin:0.5em 0}\
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#f3f3f3}td.l,th.l{text-align:left}\
td.diag{background:#fff3b0;font-weight:bold}\
.ok{color:#1a7f37}.bad{color:#c62828}.empty{color:#777;font-style:italic}\
.bar{display:inline-block;height:0.8em;background:#1f77b4}\
figure{margin:0.5em 0}img{max-width:100%}section{margin-bottom:2em}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_numbers() {
        assert_eq!(esc("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(num(0.41), "0.41");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(-0.00001), "0");
        assert_eq!(num(12345.6), "12346");
        assert_eq!(duration(3725.0), "3725 s (1h 02m 05s)");
    }
}
