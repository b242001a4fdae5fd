//! The chart of the STATUS page: each server's active connections over the last hour, as
//! inline SVG in two renderings (wide for a desktop, narrow for a phone; the stylesheet shows
//! one), and its legend.

use std::fmt::Write;

use super::words::esc;
use crate::query::labels::Labels;
use crate::query::snapshot::Snapshot;

/// The geometry of one rendering of the chart, in SVG units.
struct Frame {
    /// The SVG's class, which the stylesheet shows on wide or narrow screens.
    class: &'static str,
    width: f64,
    height: f64,
    /// Room for the y labels.
    left: f64,
    right: f64,
    top: f64,
    /// Room for the x labels.
    bottom: f64,
    font: f64,
    /// At most this many labels on the time axis, `now` included.
    x_labels: u64,
}

/// A desktop's chart: wide and low.
const WIDE: Frame = Frame {
    class: "wide",
    width: 1200.0,
    height: 200.0,
    left: 40.0,
    right: 24.0,
    top: 10.0,
    bottom: 22.0,
    font: 12.0,
    x_labels: 7,
};

/// A phone's chart: its units shrink less on a narrow screen, so its text stays readable.
const NARROW: Frame = Frame {
    class: "narrow",
    width: 400.0,
    height: 220.0,
    left: 30.0,
    right: 16.0,
    top: 10.0,
    bottom: 22.0,
    font: 13.0,
    x_labels: 4,
};

/// Colours of the chart's lines, distinct on white.
const PALETTE: [&str; 10] = [
    "#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#0f7b8a", "#bf3989", "#57606a",
    "#fb8500", "#2da44e",
];

/// How series `i` is drawn: colour, width, dashes. Lines of the same values lie on each
/// other; drawn widest first, each narrower one leaves the wider ones' edges showing, and
/// series of the same width differ in their dashes.
fn line_style(i: usize) -> (&'static str, f64, &'static str) {
    const WIDTHS: [f64; 3] = [7.0, 4.0, 1.5];
    const DASHES: [&str; 4] = ["none", "10 5", "2 4", "12 4 3 4"];
    (
        PALETTE[i % PALETTE.len()],
        WIDTHS[i % WIDTHS.len()],
        DASHES[(i / WIDTHS.len()) % DASHES.len()],
    )
}

/// The y axis: a round step (1, 2 or 5 times a power of ten) that divides the scale into at
/// most five parts, and the top of the scale, a multiple of it at or above `max`.
fn y_scale(max: u64) -> (u64, u64) {
    let max = max.max(1);
    let mut magnitude = 1u64;
    loop {
        for step in [
            magnitude,
            magnitude.saturating_mul(2),
            magnitude.saturating_mul(5),
        ] {
            if max.div_ceil(step) <= 5 {
                return (step, step.saturating_mul(max.div_ceil(step)));
            }
        }
        magnitude = magnitude.saturating_mul(10);
    }
}

/// Minutes between the time axis's labels: the first of these that keeps to `labels`.
fn x_step(window_minutes: u64, labels: u64) -> u64 {
    [1, 2, 5, 10, 15, 20, 30, 60]
        .into_iter()
        .find(|step| window_minutes / step < labels)
        .unwrap_or(60)
}

/// The chart: each server's active connections at each minute's sample over the last hour
/// (or since the first sample, when younger), ending with the count now. Between samples
/// nothing is known; the line holds each sample's value until the next, and a dot marks every
/// sample, so a connection opened a second ago shows as a step at the right edge, not a
/// slope over the minute before.
pub(super) fn chart(out: &mut String, l: &Labels, snap: &Snapshot) {
    let _ = write!(
        out,
        "<div class='card chart'><h2>{} <small>· {}</small></h2>",
        l.chart, l.chart_note
    );
    for frame in [&WIDE, &NARROW] {
        chart_svg(out, l, snap, frame);
    }
    out.push_str("<div class='legend'>");
    for (i, s) in snap.state.servers.iter().enumerate() {
        let (colour, width, dash) = line_style(i);
        let _ = write!(
            out,
            "<span><svg width='30' height='12' aria-hidden='true'><line x1='1' y1='6' x2='29' y2='6' \
             stroke='{colour}' stroke-width='{}' stroke-dasharray='{dash}'/></svg>{} {}</span>",
            width.min(5.0),
            esc(&s.id),
            esc(&s.address)
        );
    }
    out.push_str("</div></div>");
}

/// A point of a series: (time, value, whether it is a sample or the count now; false for the
/// value held at the left edge).
type Point = (u64, u64, bool);

/// Where a chart's values go in its frame.
struct Plot<'a> {
    f: &'a Frame,
    now: u64,
    /// The left edge (wall ms) and the window's width (ms).
    start: u64,
    window: u64,
    /// The window in minutes, and the minutes between the time axis's labels.
    minutes: u64,
    every: u64,
    /// The value axis's step and top.
    step: u64,
    top: u64,
}

impl Plot<'_> {
    fn width(&self) -> f64 {
        self.f.width - self.f.left - self.f.right
    }

    fn x(&self, t: u64) -> f64 {
        self.f.left + self.width() * (t.saturating_sub(self.start) as f64 / self.window as f64)
    }

    fn y(&self, v: u64) -> f64 {
        let height = self.f.height - self.f.top - self.f.bottom;
        self.f.top + height * (1.0 - v as f64 / self.top as f64)
    }

    /// The value axis's lines and labels, then the time axis's.
    fn grid(&self, out: &mut String, l: &Labels) {
        let f = self.f;
        for value in (0..=self.top).step_by(self.step as usize) {
            let yy = self.y(value);
            let _ = write!(
                out,
                "<line x1='{}' x2='{}' y1='{yy:.1}' y2='{yy:.1}' stroke='#e3e8ee'/>\
                 <text class='y' x='{}' y='{:.1}' text-anchor='end'>{value}</text>",
                f.left,
                f.width - f.right,
                f.left - 6.0,
                yy + f.font / 3.0
            );
        }
        let ticks: Vec<u64> = (0..=self.minutes).step_by(self.every as usize).collect();
        for ago in ticks.into_iter().rev() {
            let xx = self.x(self.now - ago * 60_000);
            let (label, anchor) = match ago {
                0 => (l.chart_now.to_string(), "end"),
                _ if ago == self.minutes => (format!("-{ago} min"), "start"),
                _ => (format!("-{ago} min"), "middle"),
            };
            let _ = write!(
                out,
                "<line x1='{xx:.1}' x2='{xx:.1}' y1='{}' y2='{}' stroke='#eef1f4'/>\
                 <text class='x' x='{xx:.1}' y='{}' text-anchor='{anchor}'>{label}</text>",
                f.top,
                f.height - f.bottom,
                f.height - 5.0
            );
        }
    }

    /// Series `i` (the server at `address`): its line, and a dot on each sample.
    fn series(&self, out: &mut String, i: usize, address: &str, points: &[Point]) {
        let (colour, width, dash) = line_style(i);
        let mut path = String::new();
        for (n, &(t, v, _)) in points.iter().enumerate() {
            if n == 0 {
                let _ = write!(path, "M{:.1},{:.1}", self.x(t), self.y(v));
            } else {
                // Held until this sample, then the step to its value.
                let _ = write!(path, " H{:.1} V{:.1}", self.x(t), self.y(v));
            }
        }
        let _ = write!(
            out,
            "<path class='series' data-server='{}' d='{path}' fill='none' stroke='{colour}' \
             stroke-width='{width}' stroke-dasharray='{dash}' stroke-linejoin='round'/>",
            esc(address)
        );
        // A dot on each sample and on now (not on the value held at the left edge), small
        // enough that an hour of minutes stays a row of dots on a phone.
        let radius = (self.width() / self.minutes as f64 / 4.0).clamp(1.2, 2.5);
        for &(t, v, _) in points.iter().filter(|&&(_, _, sample)| sample) {
            let _ = write!(
                out,
                "<circle class='sample' cx='{:.1}' cy='{:.1}' r='{radius}' fill='{colour}' stroke='#fff' stroke-width='1'/>",
                self.x(t),
                self.y(v)
            );
        }
    }
}

/// Each server's points from `start` to `now`: the value held at the left edge (when a sample
/// came before it), the samples in the window, and the count now.
fn series_between(snap: &Snapshot, start: u64, now: u64) -> Vec<Vec<Point>> {
    snap.state
        .servers
        .iter()
        .map(|s| {
            let before = s.samples.iter().rev().find(|&&(t, _)| t < start);
            let mut points: Vec<Point> = before
                .map(|&(_, v)| (start, v, false))
                .into_iter()
                .collect();
            points.extend(
                s.samples
                    .iter()
                    .filter(|&&(t, _)| t >= start && t <= now)
                    .map(|&(t, v)| (t, v, true)),
            );
            points.push((now, s.active, true));
            points
        })
        .collect()
}

fn chart_svg(out: &mut String, l: &Labels, snap: &Snapshot, f: &Frame) {
    let now = snap.now_wall_ms;
    let oldest = snap
        .state
        .servers
        .iter()
        .filter_map(|s| s.samples.first().map(|&(t, _)| t))
        .min()
        .unwrap_or(now);
    // Whole minutes, one at least, an hour at most, rounded up to the labels' step (each
    // step divides 60) so the left edge is labelled too.
    let age = now.saturating_sub(oldest).div_ceil(60_000).clamp(1, 60);
    let every = x_step(age, f.x_labels);
    let minutes = age.div_ceil(every) * every;
    let window = minutes * 60_000;
    let start = now - window.min(now);
    let series = series_between(snap, start, now);
    let max = series
        .iter()
        .flatten()
        .map(|&(_, v, _)| v)
        .max()
        .unwrap_or(0);
    let (step, top) = y_scale(max);
    let plot = Plot {
        f,
        now,
        start,
        window,
        minutes,
        every,
        step,
        top,
    };
    let _ = write!(
        out,
        "<svg class='{}' viewBox='0 0 {} {}' role='img' aria-label='{}' xmlns='http://www.w3.org/2000/svg' \
         font-size='{}' fill='#5f6b78'>",
        f.class, f.width, f.height, l.chart, f.font
    );
    plot.grid(out, l);
    // Widest first: narrower lines on top leave the wider ones' edges showing.
    let mut order: Vec<usize> = (0..series.len()).collect();
    order.sort_by(|&a, &b| line_style(b).1.total_cmp(&line_style(a).1));
    for i in order {
        plot.series(out, i, &snap.state.servers[i].address, &series[i]);
    }
    out.push_str("</svg>");
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{NOW, server, snapshot};
    use super::*;
    use crate::config::Language;
    use crate::query::labels::of;
    use crate::query::snapshot::ServerState;

    /// The chart of `class` (`wide` or `narrow`) as rendered.
    fn chart_of(snap: &Snapshot, class: &str) -> String {
        let mut out = String::new();
        chart(&mut out, of(snap.language), snap);
        let start = out
            .find(&format!("<svg class='{class}'"))
            .expect("the chart");
        out[start..start + out[start..].find("</svg>").expect("its end")].to_string()
    }

    /// The values of attribute `name` on every `<tag` of `svg` with `class`.
    fn attributes(svg: &str, tag_class: &str, name: &str) -> Vec<String> {
        svg.split(tag_class)
            .skip(1)
            .map(|rest| {
                let at = rest.find(&format!(" {name}='")).expect("the attribute") + name.len() + 3;
                rest[at..at + rest[at..].find('\'').expect("quoted")].to_string()
            })
            .collect()
    }

    /// The texts of the axis labels of `class` (`x` or `y`).
    fn labels(svg: &str, class: &str) -> Vec<String> {
        svg.split(&format!("<text class='{class}'"))
            .skip(1)
            .map(|rest| {
                let text = &rest[rest.find('>').expect("tag end") + 1..];
                text[..text.find('<').expect("text end")].to_string()
            })
            .collect()
    }

    /// A path of `M x,y H x V y ...` commands as its corners.
    fn corners(d: &str) -> Vec<(f64, f64)> {
        let mut corners = Vec::new();
        let (mut x, mut y) = (0.0, 0.0);
        for command in d.split_whitespace() {
            let (letter, rest) = command.split_at(1);
            match letter {
                "M" => {
                    let (a, b) = rest.split_once(',').expect("x,y");
                    (x, y) = (a.parse().expect("x"), b.parse().expect("y"));
                }
                "H" => x = rest.parse().expect("x"),
                "V" => y = rest.parse().expect("y"),
                other => panic!("{other}: only moves, horizontal and vertical lines"),
            }
            corners.push((x, y));
        }
        corners
    }

    #[test]
    fn y_ticks_are_round_and_cover_the_largest_count() {
        for (max, ticks) in [
            (0, vec![0, 1]),
            (1, vec![0, 1]),
            (3, vec![0, 1, 2, 3]),
            (5, vec![0, 1, 2, 3, 4, 5]),
            (6, vec![0, 2, 4, 6]),
            (7, vec![0, 2, 4, 6, 8]),
            (13, vec![0, 5, 10, 15]),
            (40, vec![0, 10, 20, 30, 40]),
            (99, vec![0, 20, 40, 60, 80, 100]),
            (1234, vec![0, 500, 1000, 1500]),
        ] {
            let snap = snapshot(NOW, vec![server(1, NOW, &[(3, 0)], max)]);
            let wanted: Vec<String> = ticks.iter().map(u64::to_string).collect();
            for class in ["wide", "narrow"] {
                assert_eq!(labels(&chart_of(&snap, class), "y"), wanted, "max {max}");
            }
        }
        // No count can overflow the scale.
        assert_eq!(y_scale(u64::MAX - 1).1, u64::MAX);
    }

    #[test]
    fn the_time_axis_is_labelled_in_whole_minutes() {
        for (age, wide, narrow) in [
            (60, "-60 -50 -40 -30 -20 -10 now", "-60 -40 -20 now"),
            (30, "-30 -25 -20 -15 -10 -5 now", "-30 -20 -10 now"),
            (5, "-5 -4 -3 -2 -1 now", "-6 -4 -2 now"),
            (1, "-1 now", "-1 now"),
        ] {
            // Sampled `age` minutes ago and one second later (a young broker).
            let samples = [(age, 1)];
            let mut s = server(1, NOW, &samples, 1);
            s.samples[0].0 += 1_000;
            let snap = snapshot(NOW, vec![s]);
            for (class, wanted) in [("wide", wide), ("narrow", narrow)] {
                let got: Vec<String> = labels(&chart_of(&snap, class), "x")
                    .into_iter()
                    .map(|l| l.replace(" min", ""))
                    .collect();
                let wanted: Vec<&str> = wanted.split(' ').collect();
                assert_eq!(got, wanted, "{class} chart of a broker {age} minutes old");
            }
        }
        let snap = snapshot(NOW, vec![server(1, NOW, &[(61, 1), (60, 1)], 1)]);
        let x = labels(&chart_of(&snap, "wide"), "x");
        assert_eq!(
            x.first().map(String::as_str),
            Some("-60 min"),
            "an hour at most"
        );
    }

    #[test]
    fn lines_step_at_the_sample_times_with_a_dot_on_each() {
        // Sampled 0 three and two minutes ago, 4 a minute ago; 5 now.
        let snap = snapshot(NOW, vec![server(1, NOW, &[(3, 0), (2, 0), (1, 4)], 5)]);
        let svg = chart_of(&snap, "wide");
        let d = &attributes(&svg, "<path class='series'", "d")[0];
        let corners = corners(d);
        let xs: Vec<f64> = corners.iter().map(|c| c.0).collect();
        let x = |minutes_ago: f64| {
            WIDE.left + (WIDE.width - WIDE.left - WIDE.right) * (1.0 - minutes_ago / 3.0)
        };
        // Every segment horizontal or vertical: a value holds until the next sample.
        for pair in corners.windows(2) {
            assert!(
                pair[0].0 == pair[1].0 || pair[0].1 == pair[1].1,
                "a slope in {d}"
            );
        }
        // The rise to 4 is at the sample a minute ago, the one to 5 now: not before.
        let rises: Vec<f64> = corners
            .windows(2)
            .filter(|p| p[1].1 < p[0].1)
            .map(|p| p[1].0)
            .collect();
        assert_eq!(rises.len(), 2, "{d}");
        assert!((rises[0] - x(1.0)).abs() < 0.2, "{rises:?} {xs:?}");
        assert!((rises[1] - x(0.0)).abs() < 0.2, "{rises:?}");
        // A dot on each of the three samples and on now.
        let dots = attributes(&svg, "<circle class='sample'", "cx");
        assert_eq!(dots.len(), 4, "{svg}");
    }

    #[test]
    fn lines_of_the_same_counts_stay_distinguishable() {
        let samples = [(10, 2), (9, 2), (8, 3)];
        let servers: Vec<ServerState> = (0..14)
            .map(|i| server(6000 + i, NOW, &samples, 3))
            .collect();
        let snap = snapshot(NOW, servers);
        let svg = chart_of(&snap, "wide");
        let tag = "<path class='series'";
        let styles: Vec<(String, String, String)> = attributes(&svg, tag, "stroke")
            .into_iter()
            .zip(attributes(&svg, tag, "stroke-width"))
            .zip(attributes(&svg, tag, "stroke-dasharray"))
            .map(|((c, w), d)| (c, w, d))
            .collect();
        assert_eq!(styles.len(), 14);
        let mut distinct = styles.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 14, "two servers drawn alike: {styles:?}");
        // Drawn widest first, so a narrower line on top leaves the wider one showing.
        let widths: Vec<f64> = styles
            .iter()
            .map(|s| s.1.parse().expect("a width"))
            .collect();
        assert!(widths.windows(2).all(|w| w[0] >= w[1]), "{widths:?}");
        // Each server's legend shows its line's colour and dashes.
        let mut legend = String::new();
        chart(&mut legend, of(Language::English), &snap);
        for i in 0..14 {
            let (colour, _, dash) = line_style(i);
            let entry = format!("stroke='{colour}' stroke-width=");
            let at = legend
                .find(&format!(
                    "{} 10.0.0.1:{}",
                    snap.state.servers[i].id,
                    6000 + i
                ))
                .expect("in the legend");
            let swatch = &legend[..at];
            let swatch = &swatch[swatch.rfind("<svg").expect("a swatch")..];
            assert!(
                swatch.contains(&entry) && swatch.contains(&format!("stroke-dasharray='{dash}'")),
                "{swatch}"
            );
        }
    }

    #[test]
    fn a_server_added_a_minute_ago_is_a_line_from_then() {
        // One sample: the one its creation records (balancer::Server::new).
        let old = server(1, NOW, &[(40, 1), (39, 1)], 1);
        let new = server(2, NOW, &[(1, 0)], 2);
        let snap = snapshot(NOW, vec![old, new]);
        let svg = chart_of(&snap, "wide");
        let paths = attributes(&svg, "<path class='series'", "d");
        let corners = corners(&paths[1]);
        assert!(corners.len() >= 3, "more than a dot: {paths:?}");
        let span = corners.last().expect("corners").0 - corners[0].0;
        let minute = (WIDE.width - WIDE.left - WIDE.right) / 40.0;
        assert!(
            (span - minute).abs() < 0.5,
            "from a minute ago to now: {span} vs {minute}"
        );
    }
}
