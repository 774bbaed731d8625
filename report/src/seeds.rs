//! [`write_seeds_report`]: the page of a multi-seed run (`cascade run --seeds N`):
//! `DIR/report/index.html` from the summary [`SeedsSummary`] (`DIR/seeds.json`), with links to
//! every seed's own report.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use cascade_shared::metrics::{SeedsSummary, Spread};

use crate::html::{esc, num, STYLE};
use crate::ReportError;

fn spread(s: &Spread) -> String {
    if s.n == 0 {
        return "—".to_string();
    }
    if s.n == 1 {
        return num(s.mean);
    }
    format!(
        "{} ± {} <small>({} … {})</small>",
        num(s.mean),
        num(s.sd),
        num(s.min),
        num(s.max)
    )
}

/// Writes `dir/report/index.html` for the summary of a multi-seed run and returns its path.
pub fn write_seeds_report(dir: &Path, summary: &SeedsSummary) -> Result<PathBuf, ReportError> {
    let out_dir = dir.join("report");
    std::fs::create_dir_all(&out_dir).map_err(|source| ReportError::Io {
        path: out_dir.clone(),
        source,
    })?;
    let n = summary.seeds.len();
    let mut h = String::new();
    let title = format!(
        "Cascade across {n} seed(s) — {}",
        dir.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string())
    );
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{t}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n",
        t = esc(&title)
    );

    h.push_str("<section id=\"goals\">\n<h2>Goals</h2>\n<ul>\n");
    for c in &summary.checks {
        let _ = write!(
            h,
            "<li><span class=\"{}\">{}</span> {}",
            if c.passed { "ok" } else { "bad" },
            if c.passed { "met" } else { "NOT MET" },
            esc(&c.goal)
        );
        if !c.failures.is_empty() {
            h.push_str("<ul>");
            for f in &c.failures {
                let _ = write!(h, "<li>{}</li>", esc(f));
            }
            h.push_str("</ul>");
        }
        h.push_str("</li>\n");
    }
    h.push_str("</ul>\n</section>\n");

    h.push_str(
        "<section id=\"heldout\">\n<h2>Held-out scores across seeds</h2>\n\
         <p>Mean ± standard deviation over seeds (smallest … largest). The cell of a stage's own \
         domain is highlighted.</p>\n<table>\n<tr><th class=\"l\">after stage</th>",
    );
    for d in &summary.domains {
        let _ = write!(h, "<th>{}</th>", esc(d));
    }
    h.push_str("</tr>\n");
    for row in &summary.rows {
        let _ = write!(h, "<tr><td class=\"l\">{}</td>", esc(&row.after_stage));
        let own = summary
            .own_gains
            .iter()
            .find(|g| g.stage == row.after_stage)
            .map(|g| g.domain.as_str());
        for d in &summary.domains {
            let cls = if own == Some(d.as_str()) {
                " class=\"diag\""
            } else {
                ""
            };
            let cell = row.scores.get(d).map(spread).unwrap_or_else(|| "—".into());
            let _ = write!(h, "<td{cls}>{cell}</td>");
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n</section>\n");

    h.push_str(
        "<section id=\"own\">\n<h2>Each RL stage on its own domain</h2>\n\
         <p>Per seed: the paired change over the same held-out prompts ± 1 standard error.</p>\n\
         <table>\n<tr><th class=\"l\">stage</th><th class=\"l\">domain</th><th>mean change</th>\
         <th>up (&gt; 2 s.e.)</th>",
    );
    for s in &summary.seeds {
        let _ = write!(h, "<th>seed {}</th>", s.seed);
    }
    h.push_str("</tr>\n");
    for g in &summary.own_gains {
        let cls = if g.up_in == n { "ok" } else { "bad" };
        let _ = write!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td>\
             <td class=\"{cls}\">{}/{n}</td>",
            esc(&g.stage),
            esc(&g.domain),
            spread(&g.diff),
            g.up_in
        );
        for s in &g.per_seed {
            let _ = write!(h, "<td>{:+.3} ± {:.3}</td>", s.diff, s.se);
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n</section>\n");

    h.push_str(
        "<section id=\"others\">\n<h2>Each RL stage on the other domains</h2>\n\
         <p>Change against the previous row: mean over seeds, and the worst seed in brackets. \
         Marked when the worst seed drops by more than the tolerance.</p>\n\
         <table>\n<tr><th class=\"l\">stage</th>",
    );
    for d in &summary.domains {
        let _ = write!(h, "<th>{}</th>", esc(d));
    }
    h.push_str("</tr>\n");
    for row in summary.rows.iter().skip(1) {
        let _ = write!(h, "<tr><td class=\"l\">{}</td>", esc(&row.after_stage));
        for d in &summary.domains {
            match summary
                .other_changes
                .iter()
                .find(|c| c.stage == row.after_stage && &c.domain == d)
            {
                Some(c) if c.diff.n > 0 => {
                    let cls = if c.diff.min < -c.tolerance {
                        "bad"
                    } else {
                        "ok"
                    };
                    let _ = write!(
                        h,
                        "<td class=\"{cls}\">{:+.3} ({:+.3})</td>",
                        c.diff.mean, c.diff.min
                    );
                }
                Some(_) => h.push_str("<td>—</td>"),
                None => h.push_str("<td class=\"diag\">own</td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n</section>\n");

    h.push_str(
        "<section id=\"retention\">\n<h2>What is left at the end</h2>\n<table>\n\
         <tr><th class=\"l\">domain</th><th class=\"l\">own stage</th><th>right after it</th>\
         <th>after the last stage</th><th>change</th><th>allowed</th></tr>\n",
    );
    for r in &summary.retention {
        let cls = if r.change.mean < -r.tolerance {
            "bad"
        } else {
            "ok"
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td>\
             <td class=\"{cls}\">{}</td><td>−{}</td></tr>",
            esc(&r.domain),
            esc(&r.stage),
            spread(&r.after_own),
            spread(&r.last),
            spread(&r.change),
            num(r.tolerance)
        );
    }
    h.push_str("</table>\n</section>\n");

    h.push_str("<section id=\"runs\">\n<h2>Runs</h2>\n<table>\n<tr><th>seed</th><th class=\"l\">report</th><th>wall clock</th></tr>\n");
    for s in &summary.seeds {
        let name = Path::new(&s.run_dir)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| s.run_dir.clone());
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"l\"><a href=\"../{n}/report/index.html\">{n}</a></td><td>{}</td></tr>",
            s.seed,
            s.wall_s.map(|w| format!("{w:.0} s")).unwrap_or_else(|| "—".into()),
            n = esc(&name)
        );
    }
    let _ = writeln!(
        h,
        "</table>\n<p>Wall clock per run: {}</p>\n</section>\n</body>\n</html>",
        spread(&summary.wall_s)
    );
    let path = out_dir.join("index.html");
    std::fs::write(&path, h).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}
