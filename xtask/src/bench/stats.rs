//! Medians with their spread: every figure of the benchmark is stated as the median of its
//! rounds next to the range (min - max) those rounds covered.

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Rounds that gave a value.
    pub n: usize,
}

impl Spread {
    /// None when no value is finite.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    pub fn json(&self, digits: i32) -> Value {
        json!({
            "median": round(self.median, digits),
            "min": round(self.min, digits),
            "max": round(self.max, digits),
            "rounds": self.n,
        })
    }

    /// `12.3 (11.9 - 13.0)`; a single round has no range.
    pub fn show(&self, digits: usize) -> String {
        if self.n < 2 {
            return format!("{:.digits$}", self.median);
        }
        format!(
            "{:.digits$} ({:.digits$} - {:.digits$})",
            self.median, self.min, self.max
        )
    }
}

impl Spread {
    /// A ratio: `1.21x (1.15 - 1.30)`.
    pub fn show_x(&self) -> String {
        if self.n < 2 {
            return format!("{:.2}x", self.median);
        }
        format!("{:.2}x ({:.2} - {:.2})", self.median, self.min, self.max)
    }

    /// A fraction as a signed percentage: `+1.2% (-0.4% - +2.0%)`.
    pub fn show_pct(&self) -> String {
        let p = |x: f64| format!("{:+.1}%", x * 100.0);
        if self.n < 2 {
            return p(self.median);
        }
        format!("{} ({} - {})", p(self.median), p(self.min), p(self.max))
    }
}

pub fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// The spread of a figure, or "-" when it has none.
pub fn show(s: Option<Spread>, digits: usize) -> String {
    s.map_or("-".into(), |s| s.show(digits))
}

pub fn json_of(s: Option<Spread>, digits: i32) -> Value {
    s.map_or(Value::Null, |s| s.json(digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranges() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of([4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of([]), None);
        // Rounds without a value (NaN: e.g. a ratio to a zero) are left out.
        assert_eq!(Spread::of([f64::NAN, 5.0]).unwrap().n, 1);
        assert_eq!(
            Spread::of([1.25, 1.5]).unwrap().show(2),
            "1.38 (1.25 - 1.50)"
        );
        assert_eq!(Spread::of([7.0]).unwrap().show(1), "7.0");
        assert_eq!(
            Spread::of([1.0, 1.5]).unwrap().show_x(),
            "1.25x (1.00 - 1.50)"
        );
        assert_eq!(
            Spread::of([0.012, -0.004, 0.02]).unwrap().show_pct(),
            "+1.2% (-0.4% - +2.0%)"
        );
    }
}
