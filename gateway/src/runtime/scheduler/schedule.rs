//! The scheduler's schedule maths: judging a client's schedule, its fire times, the catch-up
//! decision for a due job, and the heartbeat's daily active window. Pure: no clock, no I/O.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

const MEMBER_EXPR: &str = "schedule.expr";
const MEMBER_TZ: &str = "schedule.tz";
const MEMBER_EVERY: &str = "schedule.everyMs";
const MEMBER_AT: &str = "schedule.at";
const MEMBER_HOURS_START: &str = "activeHours.start";
const MEMBER_HOURS_END: &str = "activeHours.end";
const MEMBER_HOURS_TZ: &str = "activeHours.tz";

/// One second: anything shorter would turn the scheduler into a busy loop.
pub const MIN_EVERY_MS: i64 = 1_000;
/// 365 days.
pub const MAX_EVERY_MS: i64 = 31_536_000_000;

const SECOND_MS: i64 = 1_000;
const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Cron,
    Interval,
    Once,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cron => "cron",
            Kind::Interval => "interval",
            Kind::Once => "once",
        }
    }
}

/// The schedule as a client sent it (cron.add/update, or the configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleSpec<'a> {
    pub kind: Kind,
    pub expr: Option<&'a str>,
    pub tz: Option<&'a str>,
    pub every_ms: Option<i64>,
    pub at: Option<&'a str>,
}

/// A refused schedule: `member` is the JSON path the error names, one of
/// "schedule.expr", "schedule.tz", "schedule.everyMs", "schedule.at" (or "schedule.kind").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub member: &'static str,
    pub why: String,
}

impl Invalid {
    fn new(member: &'static str, why: impl Into<String>) -> Invalid {
        Invalid {
            member,
            why: why.into(),
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.member, self.why)
    }
}

impl std::error::Error for Invalid {}

/// A parsed, valid schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    // Boxed: a parsed pattern is over 300 bytes, the other kinds a word or two.
    Cron { cron: Box<Cron>, tz: Tz },
    Interval { every_ms: i64 },
    Once { at_ms: i64 },
}

impl Schedule {
    /// Judges the spec; `now_ms` is only used to refuse an `at` in the past (and to probe that a
    /// cron expression fires at all).
    ///
    /// # Errors
    /// [`Invalid`] naming the first offending member: one the kind does not take, a missing one,
    /// then a malformed value.
    pub fn parse(spec: &ScheduleSpec<'_>, now_ms: i64) -> Result<Schedule, Invalid> {
        match spec.kind {
            Kind::Cron => parse_cron(spec, now_ms),
            Kind::Interval => parse_interval(spec),
            Kind::Once => parse_once(spec, now_ms),
        }
    }

    /// The first fire time strictly after `after_ms`, or None when it never fires again.
    /// `anchor_ms` is the interval kind's anchor: interval fires are anchor + k*every (k >= 1).
    #[must_use]
    pub fn next_after(&self, after_ms: i64, anchor_ms: i64) -> Option<i64> {
        match &self.inner {
            Inner::Cron { cron, tz } => {
                // The DST rule is croner 4.0.3's own, documented and tested below rather than
                // reimplemented: the pattern is matched against the wall clock of `tz`;
                // a fixed-time job (one second, one minute and one hour, no step or wildcard)
                // whose time falls in a spring-forward gap fires at the first real instant after
                // the gap, and fires once, on the first pass, in an autumn overlap; any other
                // pattern follows real elapsed time: the wall clock times a gap removes are
                // skipped, and both passes of an overlap fire.
                //
                // Croner works in whole seconds and answers strictly after the second it is
                // given, so flooring keeps "strictly after `after_ms`" for sub-second input.
                let after_s = after_ms.div_euclid(SECOND_MS);
                let next = cron_next(cron, tz, after_s).or_else(|| {
                    // Croner gives up (TimeSearchLimitExceeded) on a fixed time that falls in a
                    // gap longer than its two-hour probe, as when Samoa skipped 30 December 2011.
                    // Only a pattern that fires a few days on is worth stepping past such a gap,
                    // an hour at a time; for one that never fires this costs one more search.
                    const GAP_STEP_S: i64 = 3_600;
                    const GAP_STEPS: i64 = 72;
                    cron_next(cron, tz, after_s.checked_add(GAP_STEP_S * GAP_STEPS)?)?;
                    (1..GAP_STEPS).find_map(|step| cron_next(cron, tz, after_s + GAP_STEP_S * step))
                })?;
                // A non-advancing answer would spin the caller; croner never gives one, and
                // this keeps it that way.
                (next > after_ms).then_some(next)
            }
            Inner::Interval { every_ms } => interval_next(anchor_ms, *every_ms, after_ms),
            Inner::Once { at_ms } => (*at_ms > after_ms).then_some(*at_ms),
        }
    }

    #[must_use]
    pub fn kind(&self) -> Kind {
        match self.inner {
            Inner::Cron { .. } => Kind::Cron,
            Inner::Interval { .. } => Kind::Interval,
            Inner::Once { .. } => Kind::Once,
        }
    }
}

/// Croner's next match strictly after the whole second `after_s`, in epoch milliseconds.
fn cron_next(cron: &Cron, tz: &Tz, after_s: i64) -> Option<i64> {
    let start = DateTime::from_timestamp(after_s, 0)?.with_timezone(tz);
    cron.find_next_occurrence(&start, false)
        .ok()
        .map(|next| next.timestamp_millis())
}

fn refuse_foreign(present: bool, member: &'static str, kind: Kind) -> Result<(), Invalid> {
    if present {
        Err(Invalid::new(
            member,
            format!("not allowed with kind {}", kind.name()),
        ))
    } else {
        Ok(())
    }
}

fn required<T>(value: Option<T>, member: &'static str, kind: Kind) -> Result<T, Invalid> {
    value.ok_or_else(|| Invalid::new(member, format!("required with kind {}", kind.name())))
}

fn parse_zone(name: Option<&str>, member: &'static str) -> Result<Tz, Invalid> {
    match name {
        None => Ok(Tz::UTC),
        Some(name) => Tz::from_str(name).map_err(|_| {
            Invalid::new(
                member,
                format!(
                    "unknown time zone {:?}: expected an IANA name such as \"Europe/Paris\" (case matters)",
                    clip(name)
                ),
            )
        }),
    }
}

/// Keeps an echoed client string short enough for an error message.
fn clip(text: &str) -> String {
    super::clip(text, 64)
}

fn parse_cron(spec: &ScheduleSpec<'_>, now_ms: i64) -> Result<Schedule, Invalid> {
    refuse_foreign(spec.every_ms.is_some(), MEMBER_EVERY, Kind::Cron)?;
    refuse_foreign(spec.at.is_some(), MEMBER_AT, Kind::Cron)?;
    let expr = required(spec.expr, MEMBER_EXPR, Kind::Cron)?;
    let tz = parse_zone(spec.tz, MEMBER_TZ)?;
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|err| Invalid::new(MEMBER_EXPR, explain_cron_error(expr, &err.to_string())))?;
    let schedule = Schedule {
        inner: Inner::Cron {
            cron: Box::new(cron),
            tz,
        },
    };
    // Without a year field the calendar repeats every 400 years, so a pattern that fires at all
    // fires again within that; one probe from now (croner searches to the year 5000) tells
    // "never" apart from "rarely" (`0 0 29 2 +1`, a Monday 29 February, recurs in 28 years).
    if schedule.next_after(now_ms, now_ms).is_none() {
        return Err(Invalid::new(MEMBER_EXPR, "never fires"));
    }
    Ok(schedule)
}

/// Croner's own message, plus the spelling croner 4 wants when the expression has a step whose
/// start is a single value (`5/5`): that is the usual way people trip over it.
fn explain_cron_error(expr: &str, croner_message: &str) -> String {
    let mut why = croner_message.to_string();
    if let Some(hint) = step_hint(expr) {
        why.push_str("; ");
        why.push_str(&hint);
    }
    why
}

fn step_hint(expr: &str) -> Option<String> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let field_max: &[u32] = match fields.len() {
        5 => &[59, 23, 31, 12, 6],
        6 => &[59, 59, 23, 31, 12, 6],
        _ => &[],
    };
    for (index, field) in fields.iter().enumerate() {
        for item in field.split(',') {
            let Some((start, step)) = item.split_once('/') else {
                continue;
            };
            if start == "*" || start.contains('-') {
                continue;
            }
            let instead = if start.is_empty() {
                format!("*/{step}")
            } else {
                match (start.parse::<u32>(), field_max.get(index)) {
                    (Ok(first), Some(&max)) if first <= max => format!("{first}-{max}/{step}"),
                    _ => "5-59/5".to_string(),
                }
            };
            let example = if instead == "5-59/5" {
                String::new()
            } else {
                ", as in `5-59/5`".to_string()
            };
            return Some(format!(
                "a step needs a range or `*` before it{example}: write `{}`, not `{}`",
                clip(&instead),
                clip(item)
            ));
        }
    }
    None
}

fn parse_interval(spec: &ScheduleSpec<'_>) -> Result<Schedule, Invalid> {
    refuse_foreign(spec.expr.is_some(), MEMBER_EXPR, Kind::Interval)?;
    refuse_foreign(spec.tz.is_some(), MEMBER_TZ, Kind::Interval)?;
    refuse_foreign(spec.at.is_some(), MEMBER_AT, Kind::Interval)?;
    let every_ms = required(spec.every_ms, MEMBER_EVERY, Kind::Interval)?;
    if !(MIN_EVERY_MS..=MAX_EVERY_MS).contains(&every_ms) {
        return Err(Invalid::new(
            MEMBER_EVERY,
            format!(
                "must be between {MIN_EVERY_MS} (one second) and {MAX_EVERY_MS} (365 days), not {every_ms}"
            ),
        ));
    }
    Ok(Schedule {
        inner: Inner::Interval { every_ms },
    })
}

/// The first `anchor + k*every` (k >= 1) strictly after `after_ms`. i128 holds every
/// intermediate value of i64 inputs, so only the final answer needs saturating.
fn interval_next(anchor_ms: i64, every_ms: i64, after_ms: i64) -> Option<i64> {
    if every_ms <= 0 {
        return None;
    }
    let (anchor, every, after) = (
        i128::from(anchor_ms),
        i128::from(every_ms),
        i128::from(after_ms),
    );
    let k = ((after - anchor).div_euclid(every) + 1).max(1);
    let next = anchor + k * every;
    let saturated = i64::try_from(next).unwrap_or(if next < 0 { i64::MIN } else { i64::MAX });
    (saturated > after_ms).then_some(saturated)
}

fn parse_once(spec: &ScheduleSpec<'_>, now_ms: i64) -> Result<Schedule, Invalid> {
    refuse_foreign(spec.expr.is_some(), MEMBER_EXPR, Kind::Once)?;
    refuse_foreign(spec.every_ms.is_some(), MEMBER_EVERY, Kind::Once)?;
    let at = required(spec.at, MEMBER_AT, Kind::Once)?;
    let (local, offset_s) = parse_at(at).map_err(|why| Invalid::new(MEMBER_AT, why))?;
    let at_ms = match offset_s {
        Some(offset_s) => {
            if spec.tz.is_some() {
                return Err(Invalid::new(
                    MEMBER_TZ,
                    "two zones: `at` carries its own offset, so `tz` must be left out",
                ));
            }
            local.and_utc().timestamp_millis() - i64::from(offset_s) * SECOND_MS
        }
        None => {
            let tz = parse_zone(spec.tz, MEMBER_TZ)?;
            local_to_ms(&tz, local).ok_or_else(|| {
                Invalid::new(MEMBER_AT, "no instant in that zone carries this local time")
            })?
        }
    };
    if at_ms <= now_ms {
        return Err(Invalid::new(
            MEMBER_AT,
            format!("in the past: {} is not after now", clip(at)),
        ));
    }
    Ok(Schedule {
        inner: Inner::Once { at_ms },
    })
}

/// `YYYY-MM-DDTHH:MM[:SS[.f{1,9}]][Z|±HH:MM]`: the local date and time, and the offset east of
/// UTC in seconds when one is written. Sub-milliseconds are dropped.
fn parse_at(text: &str) -> Result<(NaiveDateTime, Option<i32>), String> {
    const SHAPE: &str = "expected YYYY-MM-DDTHH:MM, optionally with :SS, a fraction of 1 to 9 digits, and Z or ±HH:MM";
    let bad = || format!("{:?}: {SHAPE}", clip(text));
    let mut reader = Reader::new(text);

    let year = reader.digits(4).ok_or_else(bad)?;
    reader.byte(b'-').ok_or_else(bad)?;
    let month = reader.digits(2).ok_or_else(bad)?;
    reader.byte(b'-').ok_or_else(bad)?;
    let day = reader.digits(2).ok_or_else(bad)?;
    reader.byte(b'T').ok_or_else(bad)?;
    let hour = reader.digits(2).ok_or_else(bad)?;
    reader.byte(b':').ok_or_else(bad)?;
    let minute = reader.digits(2).ok_or_else(bad)?;
    let mut second = 0;
    let mut milli = 0;
    if reader.byte(b':').is_some() {
        second = reader.digits(2).ok_or_else(bad)?;
        if reader.byte(b'.').is_some() {
            let (fraction, width) = reader.fraction().ok_or_else(bad)?;
            // Scale the written digits to nanoseconds, then keep milliseconds.
            milli = fraction * 10u32.pow(9 - width) / 1_000_000;
        }
    }
    let offset_s = match reader.peek() {
        None => None,
        Some(b'Z') => {
            reader.advance();
            Some(0)
        }
        Some(sign @ (b'+' | b'-')) => {
            reader.advance();
            let hours = reader.digits(2).ok_or_else(bad)?;
            reader.byte(b':').ok_or_else(bad)?;
            let minutes = reader.digits(2).ok_or_else(bad)?;
            if hours > 23 || minutes > 59 {
                return Err(format!("{:?}: the offset is out of range", clip(text)));
            }
            let magnitude = i32::try_from(hours * 3600 + minutes * 60).map_err(|_| bad())?;
            Some(if sign == b'-' { -magnitude } else { magnitude })
        }
        Some(_) => return Err(bad()),
    };
    if !reader.at_end() {
        return Err(bad());
    }

    let year = i32::try_from(year).map_err(|_| bad())?;
    let date = NaiveDate::from_ymd_opt(year, month, day)
        .ok_or_else(|| format!("{:?}: no such date", clip(text)))?;
    let time = NaiveTime::from_hms_milli_opt(hour, minute, second, milli)
        .ok_or_else(|| format!("{:?}: no such time of day", clip(text)))?;
    Ok((NaiveDateTime::new(date, time), offset_s))
}

/// A cursor over ASCII bytes; anything else simply fails to match.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader {
            bytes: text.as_bytes(),
            pos: 0,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn advance(&mut self) {
        self.pos = self.pos.saturating_add(1);
    }

    fn at_end(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    fn byte(&mut self, wanted: u8) -> Option<()> {
        (self.peek()? == wanted).then(|| self.advance())
    }

    /// Exactly `count` decimal digits (count <= 9, so the value fits).
    fn digits(&mut self, count: usize) -> Option<u32> {
        let mut value = 0u32;
        for _ in 0..count {
            let digit = self.peek().filter(u8::is_ascii_digit)?;
            value = value * 10 + u32::from(digit - b'0');
            self.advance();
        }
        Some(value)
    }

    /// One to nine decimal digits: their value and how many there were.
    fn fraction(&mut self) -> Option<(u32, u32)> {
        let mut value = 0u32;
        let mut width = 0u32;
        while let Some(digit) = self.peek().filter(u8::is_ascii_digit) {
            if width == 9 {
                return None;
            }
            value = value * 10 + u32::from(digit - b'0');
            width += 1;
            self.advance();
        }
        (width > 0).then_some((value, width))
    }
}

/// A local time in `zone`: the earlier instant in an overlap, and in a gap the first real instant
/// after the gap (the moment the clock jumps).
fn local_to_ms<Z: TimeZone>(zone: &Z, local: NaiveDateTime) -> Option<i64> {
    match zone.from_local_datetime(&local) {
        LocalResult::Single(at) => Some(at.timestamp_millis()),
        LocalResult::Ambiguous(earlier, _) => Some(earlier.timestamp_millis()),
        LocalResult::None => {
            let wanted = local.and_utc().timestamp_millis();
            // Real offsets stay well under a day, so the wall clock is behind `wanted` a day
            // earlier and past it a day later; across the one jump between, it only rises.
            let lo = wanted.checked_sub(DAY_MS)?;
            let hi = wanted.checked_add(DAY_MS)?;
            let after_gap = first_where(lo, hi, |at| wall_ms(zone, at) > wanted);
            (wall_ms(zone, after_gap) > wanted).then_some(after_gap)
        }
    }
}

/// Milliseconds east of UTC in `zone` at the instant `at_ms` (0 outside chrono's range).
fn offset_ms<Z: TimeZone>(zone: &Z, at_ms: i64) -> i64 {
    match DateTime::from_timestamp_millis(at_ms) {
        Some(utc) => {
            let east_s = zone
                .offset_from_utc_datetime(&utc.naive_utc())
                .fix()
                .local_minus_utc();
            i64::from(east_s) * SECOND_MS
        }
        None => 0,
    }
}

/// The wall clock of `zone` at `at_ms`, as milliseconds since the epoch of that wall clock.
fn wall_ms<Z: TimeZone>(zone: &Z, at_ms: i64) -> i64 {
    at_ms.saturating_add(offset_ms(zone, at_ms))
}

/// The smallest instant in `(lo, hi]` where `pred` holds, for a `pred` false at `lo`, true at
/// `hi` and flipping once between; `hi` when that is not so. At most 64 halvings.
fn first_where(mut lo: i64, mut hi: i64, pred: impl Fn(i64) -> bool) -> i64 {
    while lo < hi && i128::from(hi) - i128::from(lo) > 1 {
        // The midpoint of two i64 lies between them, so it always converts back.
        let Ok(middle) = i64::try_from((i128::from(lo) + i128::from(hi)) / 2) else {
            break;
        };
        if pred(middle) {
            hi = middle;
        } else {
            lo = middle;
        }
    }
    hi
}

/// The operator's catch-up policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissedFires {
    Once,
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    Schedule,
    CatchUp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Some: fire now, for due time `due_ms`, recorded with this trigger. None: do not fire.
    pub fire: Option<Trigger>,
    /// The job's next due time after this decision (None: never again).
    pub next: Option<i64>,
}

/// The job's stored next due time `due_ms` has been reached (`due_ms <= now_ms`); decide.
/// - `now_ms - due_ms <= late_tolerance_ms`: fire with Trigger::Schedule; next = next_after(now).
///   (For intervals, next keeps the anchor grid: the first anchor + k*every strictly after now.)
/// - later than the tolerance (fires were missed while nothing ran): with MissedFires::Once fire
///   ONCE with Trigger::CatchUp, next = next_after(now) (never one fire per missed occurrence);
///   with MissedFires::Skip do not fire, next = next_after(now).
/// - Once kind: next is always None after a decision (a skipped `once` never fires).
///
/// Called before `due_ms` (a clock that stepped back), it decides nothing: no fire, and the job
/// keeps `due_ms`. A negative tolerance counts as zero.
#[must_use]
pub fn plan(
    schedule: &Schedule,
    anchor_ms: i64,
    due_ms: i64,
    now_ms: i64,
    policy: MissedFires,
    late_tolerance_ms: i64,
) -> Plan {
    if now_ms < due_ms {
        return Plan {
            fire: None,
            next: Some(due_ms),
        };
    }
    let late_ms = now_ms.saturating_sub(due_ms);
    let fire = if late_ms <= late_tolerance_ms.max(0) {
        Some(Trigger::Schedule)
    } else {
        match policy {
            MissedFires::Once => Some(Trigger::CatchUp),
            MissedFires::Skip => None,
        }
    };
    let next = match schedule.kind() {
        Kind::Once => None,
        Kind::Cron | Kind::Interval => schedule.next_after(now_ms, anchor_ms),
    };
    Plan { fire, next }
}

/// The heartbeat's daily active window (HH:MM inclusive start, HH:MM or 24:00 exclusive end, in a
/// zone; end before start crosses midnight; start == end means always active). The window is read
/// off the wall clock: in an overlap the repeated hour is judged twice, as it shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveHours {
    /// Milliseconds after local midnight.
    start_ms: i64,
    end_ms: i64,
    zone: Zone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zone {
    Named(Tz),
    /// The host's zone, read when asked, so a changed host zone is followed.
    Host,
}

impl Zone {
    fn offset_ms(self, at_ms: i64) -> i64 {
        match self {
            Zone::Named(tz) => offset_ms(&tz, at_ms),
            Zone::Host => offset_ms(&chrono::Local, at_ms),
        }
    }
}

impl ActiveHours {
    /// tz None means the host's local zone (chrono::Local); an unknown zone is Invalid with member
    /// "activeHours.tz"; a malformed time names "activeHours.start" / "activeHours.end".
    ///
    /// # Errors
    /// [`Invalid`] for the first bad member, in the order start, end, tz.
    pub fn parse(start: &str, end: &str, tz: Option<&str>) -> Result<ActiveHours, Invalid> {
        let start_ms = parse_hh_mm(start, false).ok_or_else(|| {
            Invalid::new(
                MEMBER_HOURS_START,
                format!("{:?}: expected HH:MM from 00:00 to 23:59", clip(start)),
            )
        })?;
        let end_ms = parse_hh_mm(end, true).ok_or_else(|| {
            Invalid::new(
                MEMBER_HOURS_END,
                format!("{:?}: expected HH:MM from 00:00 to 24:00", clip(end)),
            )
        })?;
        let zone = match tz {
            None => Zone::Host,
            Some(_) => Zone::Named(parse_zone(tz, MEMBER_HOURS_TZ)?),
        };
        Ok(ActiveHours {
            start_ms,
            end_ms,
            zone,
        })
    }

    fn contains_time_of_day(&self, time_of_day_ms: i64) -> bool {
        let (start, end) = (self.start_ms, self.end_ms);
        if start == end {
            true
        } else if start < end {
            start <= time_of_day_ms && time_of_day_ms < end
        } else {
            time_of_day_ms >= start || time_of_day_ms < end
        }
    }

    /// `at_ms` itself when it lies inside the window, else the next instant the window opens.
    /// Must be correct across DST changes (a window start inside a spring-forward gap opens at the
    /// first real instant after the gap).
    ///
    /// "Opens" is the first instant from `at_ms` on whose wall clock is inside: usually the
    /// wall clock reaching the start, but also the moment a clock change jumps into the window.
    #[must_use]
    pub fn next_open(&self, at_ms: i64) -> i64 {
        // Each round either answers or crosses one clock change; real zones change at most a
        // few times a year, so a handful of rounds always suffices.
        const MAX_ROUNDS: usize = 8;
        let mut from = at_ms;
        for _ in 0..MAX_ROUNDS {
            let offset = self.zone.offset_ms(from);
            let time_of_day_ms = time_of_day(from.saturating_add(offset));
            if self.contains_time_of_day(time_of_day_ms) {
                return from;
            }
            // Outside, so the wall clock is not at the start: the wait is under a day.
            let wait_ms = (self.start_ms - time_of_day_ms).rem_euclid(DAY_MS);
            let opens = from.saturating_add(wait_ms);
            if opens == from || self.zone.offset_ms(opens) == offset {
                return opens;
            }
            // The clock changes before the start comes round: move to the change and judge
            // the wall clock it lands on.
            from = first_where(from, opens, |at| self.zone.offset_ms(at) != offset);
        }
        from
    }
}

fn time_of_day(wall_ms: i64) -> i64 {
    wall_ms.rem_euclid(DAY_MS)
}

/// `HH:MM` as milliseconds after midnight; `24:00` only where it may end a day.
fn parse_hh_mm(text: &str, allow_end_of_day: bool) -> Option<i64> {
    let mut reader = Reader::new(text);
    let hour = reader.digits(2)?;
    reader.byte(b':')?;
    let minute = reader.digits(2)?;
    if !reader.at_end() {
        return None;
    }
    let valid = (hour < 24 && minute < 60) || (allow_end_of_day && hour == 24 && minute == 0);
    valid.then(|| (i64::from(hour) * 60 + i64::from(minute)) * MINUTE_MS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use chrono::Utc;

    /// Epoch milliseconds of a UTC date and time.
    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .unwrap()
            .timestamp_millis()
    }

    /// Epoch milliseconds of a wall clock time that happens exactly once in `zone`.
    fn local(zone: &str, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        let tz: Tz = zone.parse().unwrap();
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .unwrap()
            .timestamp_millis()
    }

    fn iso(ms: i64) -> String {
        DateTime::from_timestamp_millis(ms)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string()
    }

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01T00:00Z

    fn spec(kind: Kind) -> ScheduleSpec<'static> {
        ScheduleSpec {
            kind,
            expr: None,
            tz: None,
            every_ms: None,
            at: None,
        }
    }

    fn cron(expr: &'static str, tz: Option<&'static str>) -> Schedule {
        let spec = ScheduleSpec {
            expr: Some(expr),
            tz,
            ..spec(Kind::Cron)
        };
        Schedule::parse(&spec, NOW).unwrap_or_else(|e| panic!("{expr}: {e}"))
    }

    fn interval(every_ms: i64) -> Schedule {
        let spec = ScheduleSpec {
            every_ms: Some(every_ms),
            ..spec(Kind::Interval)
        };
        Schedule::parse(&spec, NOW).unwrap()
    }

    fn once(at: &'static str, tz: Option<&'static str>) -> Result<Schedule, Invalid> {
        let spec = ScheduleSpec {
            at: Some(at),
            tz,
            ..spec(Kind::Once)
        };
        Schedule::parse(&spec, NOW)
    }

    fn refused(spec: ScheduleSpec<'_>) -> Invalid {
        match Schedule::parse(&spec, NOW) {
            Ok(_) => panic!("{spec:?} was accepted"),
            Err(invalid) => invalid,
        }
    }

    /// The first `count` fire times strictly after `after`.
    fn fires(schedule: &Schedule, after: i64, count: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = after;
        for _ in 0..count {
            at = schedule.next_after(at, 0).unwrap();
            out.push(iso(at));
        }
        out
    }

    #[track_caller]
    fn assert_at(actual: Option<i64>, expected: i64) {
        assert_eq!(actual.map(iso), Some(iso(expected)));
    }

    // ---- cron: plain calendar maths ----

    #[test]
    fn weekdays_at_nine_in_paris_skip_the_weekend_and_change_offset() {
        let s = cron("0 9 * * 1-5", Some("Europe/Paris"));
        // Friday 2026-03-27 10:00 CET, past that day's run: Monday's 09:00 is already CEST.
        let friday_ten = local("Europe/Paris", 2026, 3, 27, 10, 0);
        assert_eq!(friday_ten, utc(2026, 3, 27, 9, 0, 0));
        assert_at(s.next_after(friday_ten, 0), utc(2026, 3, 30, 7, 0, 0));
        // Friday 08:30 CET: the same day's run, still CET.
        assert_at(
            s.next_after(utc(2026, 3, 27, 7, 30, 0), 0),
            utc(2026, 3, 27, 8, 0, 0),
        );
    }

    #[test]
    fn day_31_skips_short_months_and_l_is_the_last_day() {
        let s = cron("0 0 31 * *", None);
        assert_at(
            s.next_after(utc(2026, 4, 1, 0, 0, 0), 0),
            utc(2026, 5, 31, 0, 0, 0),
        );
        let last = cron("0 0 L * *", None);
        assert_at(
            last.next_after(utc(2026, 2, 1, 0, 0, 0), 0),
            utc(2026, 2, 28, 0, 0, 0),
        );
        assert_at(
            last.next_after(utc(2028, 2, 1, 0, 0, 0), 0),
            utc(2028, 2, 29, 0, 0, 0),
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_combine_with_or() {
        // Vixie semantics: the 13th, or any Friday. 2026-03-01 is a Sunday.
        let s = cron("0 0 13 * 5", None);
        assert_eq!(
            fires(&s, utc(2026, 3, 1, 0, 0, 0), 4),
            [
                "2026-03-06T00:00:00.000Z",
                "2026-03-13T00:00:00.000Z",
                "2026-03-20T00:00:00.000Z",
                "2026-03-27T00:00:00.000Z",
            ]
        );
        assert_at(
            s.next_after(utc(2026, 4, 10, 0, 0, 0), 0),
            utc(2026, 4, 13, 0, 0, 0),
        );
    }

    #[test]
    fn six_fields_mean_a_leading_seconds_field() {
        let s = cron("*/5 * * * * *", None);
        let t = utc(2026, 5, 5, 12, 0, 0);
        assert_at(s.next_after(t, 0), t + 5_000);
        assert_at(s.next_after(t + 5_000, 0), t + 10_000);
        // A sub-second start still answers strictly after it, on the 5 s grid.
        assert_at(s.next_after(t + 4_999, 0), t + 5_000);
        assert_at(s.next_after(t + 5_001, 0), t + 10_000);
    }

    #[test]
    fn five_fields_fire_on_the_minute_and_nicknames_work() {
        let t = utc(2026, 5, 5, 12, 0, 30);
        assert_at(
            cron("* * * * *", None).next_after(t, 0),
            utc(2026, 5, 5, 12, 1, 0),
        );
        assert_at(
            cron("@daily", None).next_after(t, 0),
            utc(2026, 5, 6, 0, 0, 0),
        );
        assert_at(
            cron("@hourly", Some("Asia/Kolkata")).next_after(t, 0),
            utc(2026, 5, 5, 12, 30, 0),
        );
    }

    #[test]
    fn cron_ignores_the_anchor_and_answers_strictly_after() {
        let s = cron("0 12 * * *", None);
        let noon = utc(2026, 5, 5, 12, 0, 0);
        assert_at(s.next_after(noon - 1, 12_345), noon);
        assert_at(s.next_after(noon, 0), utc(2026, 5, 6, 12, 0, 0));
    }

    // ---- cron: croner 4.0.3's DST rule ----

    #[test]
    fn a_fixed_time_in_the_paris_gap_fires_at_the_end_of_the_gap() {
        let s = cron("30 2 * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 3, 28, 12, 0, 0), 2),
            // 03:00 CEST, then the next day's 02:30 CEST.
            ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]
        );
    }

    #[test]
    fn a_fixed_time_in_the_new_york_gap_fires_at_the_end_of_the_gap() {
        let s = cron("30 2 * * *", Some("America/New_York"));
        assert_eq!(
            fires(&s, utc(2026, 3, 7, 12, 0, 0), 2),
            // 03:00 EDT, then 02:30 EDT.
            ["2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z"]
        );
    }

    #[test]
    fn a_job_in_the_hour_before_the_gap_runs_once() {
        // 01:30 exists on the gap day in Paris; it must not also fire after the gap.
        let s = cron("30 1 * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 3, 28, 12, 0, 0), 2),
            // 01:30 CET, then 01:30 CEST the next day; nothing at 03:00.
            ["2026-03-29T00:30:00.000Z", "2026-03-29T23:30:00.000Z"]
        );
    }

    #[test]
    fn a_fixed_time_in_the_paris_overlap_fires_once_on_the_first_pass() {
        let s = cron("30 2 * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 10, 24, 12, 0, 0), 2),
            // 02:30 CEST; 02:30 CET that night is not a second fire.
            ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]
        );
        // Even asked from inside the second pass, before its 02:30, it waits a day.
        assert_at(
            s.next_after(utc(2026, 10, 25, 1, 10, 0), 0),
            utc(2026, 10, 26, 1, 30, 0),
        );
    }

    #[test]
    fn a_fixed_time_in_the_new_york_overlap_fires_once() {
        let s = cron("30 1 * * *", Some("America/New_York"));
        assert_eq!(
            fires(&s, utc(2026, 10, 31, 12, 0, 0), 2),
            // 01:30 EDT, then 01:30 EST the next day.
            ["2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"]
        );
    }

    #[test]
    fn a_stepped_pattern_follows_real_time_through_the_overlap() {
        let s = cron("*/30 * * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 10, 24, 23, 30, 0), 5),
            [
                "2026-10-25T00:00:00.000Z", // 02:00 CEST
                "2026-10-25T00:30:00.000Z", // 02:30 CEST
                "2026-10-25T01:00:00.000Z", // 02:00 CET
                "2026-10-25T01:30:00.000Z", // 02:30 CET
                "2026-10-25T02:00:00.000Z", // 03:00 CET
            ]
        );
    }

    #[test]
    fn a_stepped_pattern_skips_the_missing_hour_of_the_gap() {
        let s = cron("*/30 * * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 3, 29, 0, 0, 0), 3),
            [
                "2026-03-29T00:30:00.000Z", // 01:30 CET
                "2026-03-29T01:00:00.000Z", // 03:00 CEST
                "2026-03-29T01:30:00.000Z", // 03:30 CEST
            ]
        );
    }

    #[test]
    fn a_fixed_hour_with_stepped_minutes_fires_on_both_passes() {
        // Not fixed-time (the minute is stepped), so both passes of 02:xx count.
        let s = cron("*/30 2 * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 10, 24, 12, 0, 0), 5),
            [
                "2026-10-25T00:00:00.000Z",
                "2026-10-25T00:30:00.000Z",
                "2026-10-25T01:00:00.000Z",
                "2026-10-25T01:30:00.000Z",
                "2026-10-26T01:00:00.000Z",
            ]
        );
    }

    #[test]
    fn a_list_of_times_is_not_a_fixed_time() {
        // Croner calls a job fixed-time only when second, minute and hour each hold one value,
        // so `0,30 2 * * *` follows the wildcard rule: skipped in the gap, twice in the overlap.
        let s = cron("0,30 2 * * *", Some("Europe/Paris"));
        assert_eq!(
            fires(&s, utc(2026, 3, 28, 12, 0, 0), 2),
            ["2026-03-30T00:00:00.000Z", "2026-03-30T00:30:00.000Z"]
        );
        assert_eq!(
            fires(&s, utc(2026, 10, 24, 12, 0, 0), 5),
            [
                "2026-10-25T00:00:00.000Z",
                "2026-10-25T00:30:00.000Z",
                "2026-10-25T01:00:00.000Z",
                "2026-10-25T01:30:00.000Z",
                "2026-10-26T01:00:00.000Z",
            ]
        );
    }

    // ---- refusals ----

    #[test]
    fn a_seven_field_expression_is_refused() {
        let invalid = refused(ScheduleSpec {
            expr: Some("0 0 0 1 1 * 2027"),
            ..spec(Kind::Cron)
        });
        assert_eq!(invalid.member, "schedule.expr");
        assert!(invalid.why.contains("5 or 6 fields"), "{}", invalid.why);
    }

    #[test]
    fn a_single_value_step_is_refused_with_the_range_spelling() {
        let invalid = refused(ScheduleSpec {
            expr: Some("5/5 * * * *"),
            ..spec(Kind::Cron)
        });
        assert_eq!(invalid.member, "schedule.expr");
        assert!(invalid.why.contains("`5-59/5`"), "{}", invalid.why);
        assert!(invalid.why.contains("not `5/5`"), "{}", invalid.why);

        let hours = refused(ScheduleSpec {
            expr: Some("0 0 3/6 * * *"),
            ..spec(Kind::Cron)
        });
        assert!(hours.why.contains("`3-23/6`"), "{}", hours.why);
        let bare = refused(ScheduleSpec {
            expr: Some("/10 * * * *"),
            ..spec(Kind::Cron)
        });
        assert!(bare.why.contains("write `*/10`"), "{}", bare.why);

        // Other mistakes get croner's message alone.
        let other = refused(ScheduleSpec {
            expr: Some("61 * * * *"),
            ..spec(Kind::Cron)
        });
        assert_eq!(other.member, "schedule.expr");
        assert!(!other.why.contains("step"), "{}", other.why);
    }

    #[test]
    fn an_expression_that_never_fires_is_refused() {
        for expr in ["0 0 30 2 *", "0 0 31 4 *", "0 0 30 2 +1"] {
            let invalid = refused(ScheduleSpec {
                expr: Some(expr),
                ..spec(Kind::Cron)
            });
            assert_eq!(
                invalid,
                Invalid::new("schedule.expr", "never fires"),
                "{expr}"
            );
        }
        // Rare is not never: 29 February comes round.
        let leap = cron("0 0 29 2 *", None);
        assert_at(leap.next_after(NOW, 0), utc(2028, 2, 29, 0, 0, 0));
        // `+` asks for both days: a Monday 29 February.
        let leap_monday = cron("0 0 29 2 +1", None);
        assert_at(leap_monday.next_after(NOW, 0), utc(2044, 2, 29, 0, 0, 0));
    }

    #[test]
    fn cron_members_are_checked() {
        let missing = refused(spec(Kind::Cron));
        assert_eq!(missing.member, "schedule.expr");
        assert_eq!(missing.why, "required with kind cron");
        let every = refused(ScheduleSpec {
            expr: Some("* * * * *"),
            every_ms: Some(60_000),
            ..spec(Kind::Cron)
        });
        assert_eq!(every.member, "schedule.everyMs");
        let at = refused(ScheduleSpec {
            expr: Some("* * * * *"),
            at: Some("2026-06-01T12:00"),
            ..spec(Kind::Cron)
        });
        assert_eq!(at.member, "schedule.at");
        for zone in ["Mars/Base", "europe/paris", "", "CET "] {
            let tz = refused(ScheduleSpec {
                expr: Some("* * * * *"),
                tz: Some(zone),
                ..spec(Kind::Cron)
            });
            assert_eq!(tz.member, "schedule.tz", "{zone:?}");
        }
        let empty = refused(ScheduleSpec {
            expr: Some("   "),
            ..spec(Kind::Cron)
        });
        assert_eq!(empty.member, "schedule.expr");
    }

    #[test]
    fn interval_members_are_checked() {
        let base = ScheduleSpec {
            every_ms: Some(60_000),
            ..spec(Kind::Interval)
        };
        let expr = refused(ScheduleSpec {
            expr: Some("* * * * *"),
            ..base
        });
        assert_eq!(expr.member, "schedule.expr");
        let tz = refused(ScheduleSpec {
            tz: Some("UTC"),
            ..base
        });
        assert_eq!(tz.member, "schedule.tz");
        let at = refused(ScheduleSpec {
            at: Some("2026-06-01T12:00"),
            ..base
        });
        assert_eq!(at.member, "schedule.at");
        let missing = refused(spec(Kind::Interval));
        assert_eq!(missing.member, "schedule.everyMs");
        assert_eq!(missing.why, "required with kind interval");
    }

    #[test]
    fn every_ms_limits_at_and_past() {
        for bad in [i64::MIN, -1_000, 0, 999, 31_536_000_001, i64::MAX] {
            let invalid = refused(ScheduleSpec {
                every_ms: Some(bad),
                ..spec(Kind::Interval)
            });
            assert_eq!(invalid.member, "schedule.everyMs", "{bad}");
        }
        for good in [1_000, 31_536_000_000] {
            let s = interval(good);
            assert_eq!(s.kind(), Kind::Interval);
            assert_at(s.next_after(NOW, NOW), NOW + good);
        }
    }

    #[test]
    fn once_members_are_checked() {
        let missing = refused(spec(Kind::Once));
        assert_eq!(missing.member, "schedule.at");
        assert_eq!(missing.why, "required with kind once");
        let expr = refused(ScheduleSpec {
            expr: Some("* * * * *"),
            at: Some("2026-06-01T12:00"),
            ..spec(Kind::Once)
        });
        assert_eq!(expr.member, "schedule.expr");
        let every = refused(ScheduleSpec {
            every_ms: Some(60_000),
            at: Some("2026-06-01T12:00"),
            ..spec(Kind::Once)
        });
        assert_eq!(every.member, "schedule.everyMs");

        let past = once("2025-12-31T23:59:59", None).unwrap_err();
        assert_eq!(past.member, "schedule.at");
        assert!(past.why.starts_with("in the past"), "{}", past.why);
        // Exactly now is not in the future either.
        assert_eq!(
            once("2026-01-01T00:00Z", None).unwrap_err().member,
            "schedule.at"
        );

        let two_zones = once("2026-06-01T12:00:00+02:00", Some("Europe/Paris")).unwrap_err();
        assert_eq!(two_zones.member, "schedule.tz");
        assert!(two_zones.why.starts_with("two zones"), "{}", two_zones.why);
        let z_and_tz = once("2026-06-01T12:00Z", Some("UTC")).unwrap_err();
        assert_eq!(z_and_tz.member, "schedule.tz");

        assert_eq!(
            once("2026-06-01T12:00", Some("Mars/Base"))
                .unwrap_err()
                .member,
            "schedule.tz"
        );
    }

    #[test]
    fn malformed_at_values_are_refused() {
        for at in [
            "",
            "2026-06-01",
            "2026-06-01 12:00",
            "2026-06-01t12:00",
            "2026-6-01T12:00",
            "2026-06-01T12",
            "2026-06-01T12:00:",
            "2026-06-01T12:00:00.",
            "2026-06-01T12:00:00.1234567890",
            "2026-06-01T12:00.5",
            "2026-06-01T12:00:00+0200",
            "2026-06-01T12:00:00+02",
            "2026-06-01T12:00:00+24:00",
            "2026-06-01T12:00:00z",
            "2026-06-01T12:00:00Z ",
            "2026-02-30T12:00",
            "2026-06-01T24:00",
            "2026-06-01T12:60",
            "2026-06-01T12:00:60",
            "+2026-06-01T12:00",
            "２０２６-06-01T12:00",
        ] {
            let invalid = once(at, None).unwrap_err();
            assert_eq!(invalid.member, "schedule.at", "{at:?}");
        }
    }

    #[test]
    fn once_accepts_every_written_form() {
        let cases = [
            ("2026-06-01T12:00", "2026-06-01T12:00:00.000Z"),
            ("2026-06-01T12:00Z", "2026-06-01T12:00:00.000Z"),
            ("2026-06-01T12:00:07", "2026-06-01T12:00:07.000Z"),
            ("2026-06-01T12:00:07.5", "2026-06-01T12:00:07.500Z"),
            ("2026-06-01T12:00:07.123456789Z", "2026-06-01T12:00:07.123Z"),
            ("2026-06-01T12:00:00+02:00", "2026-06-01T10:00:00.000Z"),
            ("2026-06-01T12:00:00-05:30", "2026-06-01T17:30:00.000Z"),
            ("2026-06-01T12:00-00:00", "2026-06-01T12:00:00.000Z"),
        ];
        for (at, expected) in cases {
            let s = once(at, None).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert_eq!(s.kind(), Kind::Once);
            assert_eq!(
                s.next_after(NOW, 0).map(iso).as_deref(),
                Some(expected),
                "{at}"
            );
        }
    }

    #[test]
    fn a_local_once_resolves_gaps_forward_and_overlaps_early() {
        let gap = once("2026-03-29T02:30", Some("Europe/Paris")).unwrap();
        assert_at(gap.next_after(NOW, 0), utc(2026, 3, 29, 1, 0, 0));
        let overlap = once("2026-10-25T02:30", Some("Europe/Paris")).unwrap();
        assert_at(overlap.next_after(NOW, 0), utc(2026, 10, 25, 0, 30, 0));
        let new_york_gap = once("2026-03-08T02:15:30", Some("America/New_York")).unwrap();
        assert_at(new_york_gap.next_after(NOW, 0), utc(2026, 3, 8, 7, 0, 0));
        let with_offset = once("2026-06-01T12:00:00+02:00", None).unwrap();
        assert_at(with_offset.next_after(NOW, 0), utc(2026, 6, 1, 10, 0, 0));
        let plain_local = once("2026-06-01T12:00", Some("Europe/Paris")).unwrap();
        assert_at(plain_local.next_after(NOW, 0), utc(2026, 6, 1, 10, 0, 0));
    }

    #[test]
    fn once_fires_until_its_instant_and_never_after() {
        let s = once("2026-06-01T12:00Z", None).unwrap();
        let at = utc(2026, 6, 1, 12, 0, 0);
        assert_eq!(s.next_after(at - 1, 0), Some(at));
        assert_eq!(s.next_after(at, 0), None);
        assert_eq!(s.next_after(i64::MAX, 0), None);
        assert_eq!(s.next_after(i64::MIN, 0), Some(at));
    }

    // ---- interval maths ----

    #[test]
    fn interval_keeps_the_anchor_grid() {
        let s = interval(60_000);
        let anchor = utc(2026, 5, 5, 12, 0, 0);
        assert_eq!(s.next_after(anchor, anchor), Some(anchor + 60_000));
        assert_eq!(s.next_after(anchor - 5, anchor), Some(anchor + 60_000));
        assert_eq!(
            s.next_after(anchor - 3_600_000, anchor),
            Some(anchor + 60_000)
        );
        assert_eq!(s.next_after(anchor + 59_999, anchor), Some(anchor + 60_000));
        assert_eq!(
            s.next_after(anchor + 60_000, anchor),
            Some(anchor + 120_000)
        );
        assert_eq!(
            s.next_after(anchor + 630_000, anchor),
            Some(anchor + 660_000)
        );
        // Negative anchors and instants floor the same way.
        assert_eq!(s.next_after(-90_001, -150_000), Some(-90_000));
        assert_eq!(s.next_after(-90_000, -150_000), Some(-30_000));
    }

    #[test]
    fn interval_saturates_at_the_end_of_time() {
        let s = interval(MAX_EVERY_MS);
        assert_eq!(s.next_after(i64::MAX, 0), None);
        assert_eq!(s.next_after(i64::MAX - 1, 0), Some(i64::MAX));
        assert_eq!(s.next_after(0, i64::MAX), Some(i64::MAX));
        assert_eq!(
            s.next_after(i64::MIN, i64::MIN),
            Some(i64::MIN + MAX_EVERY_MS)
        );
        assert_eq!(s.next_after(i64::MAX - 2, i64::MIN), Some(i64::MAX));
        // anchor + every lies past the end of time, so the answer pins there.
        assert_eq!(s.next_after(i64::MIN, i64::MAX), Some(i64::MAX));
    }

    // ---- plan ----

    #[test]
    fn an_interval_that_missed_fires_catches_up_once() {
        let s = interval(60_000);
        let t = utc(2026, 5, 5, 12, 0, 0);
        let due = t + 60_000;
        let now = t + 630_000; // T + 10.5 min
        let tolerance = 1_000;
        assert_eq!(
            plan(&s, t, due, now, MissedFires::Once, tolerance),
            Plan {
                fire: Some(Trigger::CatchUp),
                next: Some(t + 660_000),
            }
        );
        assert_eq!(
            plan(&s, t, due, now, MissedFires::Skip, tolerance),
            Plan {
                fire: None,
                next: Some(t + 660_000),
            }
        );
        for policy in [MissedFires::Once, MissedFires::Skip] {
            assert_eq!(
                plan(&s, t, due, due + 10, policy, tolerance),
                Plan {
                    fire: Some(Trigger::Schedule),
                    next: Some(due + 60_000),
                }
            );
        }
    }

    #[test]
    fn the_tolerance_is_inclusive() {
        let s = interval(60_000);
        let due = 60_000;
        let on_time = plan(&s, 0, due, due + 500, MissedFires::Skip, 500);
        assert_eq!(on_time.fire, Some(Trigger::Schedule));
        let late = plan(&s, 0, due, due + 501, MissedFires::Skip, 500);
        assert_eq!(late.fire, None);
        let zero = plan(&s, 0, due, due, MissedFires::Skip, 0);
        assert_eq!(zero.fire, Some(Trigger::Schedule));
        let negative = plan(&s, 0, due, due, MissedFires::Skip, -5);
        assert_eq!(negative.fire, Some(Trigger::Schedule));
    }

    #[test]
    fn a_cron_job_catches_up_once_and_moves_to_the_next_real_time() {
        let s = cron("0 * * * *", None);
        let due = utc(2026, 5, 5, 9, 0, 0);
        let now = utc(2026, 5, 5, 14, 20, 0);
        assert_eq!(
            plan(&s, 0, due, now, MissedFires::Once, 60_000),
            Plan {
                fire: Some(Trigger::CatchUp),
                next: Some(utc(2026, 5, 5, 15, 0, 0)),
            }
        );
        assert_eq!(
            plan(&s, 0, due, due + 2_000, MissedFires::Skip, 60_000),
            Plan {
                fire: Some(Trigger::Schedule),
                next: Some(utc(2026, 5, 5, 10, 0, 0)),
            }
        );
    }

    #[test]
    fn a_once_job_is_decided_exactly_once() {
        let s = once("2026-06-01T12:00Z", None).unwrap();
        let due = utc(2026, 6, 1, 12, 0, 0);
        let cases = [
            (due, MissedFires::Skip, Some(Trigger::Schedule)),
            (due + 3_600_000, MissedFires::Once, Some(Trigger::CatchUp)),
            (due + 3_600_000, MissedFires::Skip, None),
        ];
        for (now, policy, fire) in cases {
            assert_eq!(
                plan(&s, 0, due, now, policy, 1_000),
                Plan { fire, next: None }
            );
        }
    }

    #[test]
    fn planning_before_the_due_time_changes_nothing() {
        let s = once("2026-06-01T12:00Z", None).unwrap();
        let due = utc(2026, 6, 1, 12, 0, 0);
        assert_eq!(
            plan(&s, 0, due, due - 1, MissedFires::Once, 0),
            Plan {
                fire: None,
                next: Some(due),
            }
        );
    }

    #[test]
    fn plan_survives_extreme_instants() {
        let s = interval(1_000);
        let p = plan(&s, 0, i64::MIN, i64::MAX, MissedFires::Once, i64::MAX);
        assert_eq!(p.fire, Some(Trigger::Schedule));
        assert_eq!(p.next, None);
        let p = plan(&s, i64::MAX, i64::MIN, 0, MissedFires::Once, 0);
        assert_eq!(p.fire, Some(Trigger::CatchUp));
        assert_eq!(p.next, Some(i64::MAX));
    }

    // ---- active hours ----

    fn hours(start: &str, end: &str, tz: &str) -> ActiveHours {
        ActiveHours::parse(start, end, Some(tz)).unwrap()
    }

    #[test]
    fn office_hours_in_paris() {
        let h = hours("09:00", "17:00", "Europe/Paris");
        let inside = local("Europe/Paris", 2026, 6, 2, 10, 15) + 123;
        assert_eq!(h.next_open(inside), inside);
        let at_start = local("Europe/Paris", 2026, 6, 2, 9, 0);
        assert_eq!(h.next_open(at_start), at_start);
        let at_end = local("Europe/Paris", 2026, 6, 2, 17, 0);
        assert_eq!(h.next_open(at_end), local("Europe/Paris", 2026, 6, 3, 9, 0));
        assert_eq!(h.next_open(at_end - 1), at_end - 1);
        let evening = local("Europe/Paris", 2026, 6, 2, 18, 0);
        assert_eq!(
            h.next_open(evening),
            local("Europe/Paris", 2026, 6, 3, 9, 0)
        );
        let early = local("Europe/Paris", 2026, 6, 2, 6, 0);
        assert_eq!(h.next_open(early), local("Europe/Paris", 2026, 6, 2, 9, 0));
        assert_eq!(h.next_open(inside), inside, "inside the window");
        assert_ne!(h.next_open(evening), evening, "outside the window");
    }

    #[test]
    fn office_hours_across_the_paris_clock_changes() {
        let h = hours("09:00", "17:00", "Europe/Paris");
        // Saturday 18:00 CET, opening on Sunday 09:00 CEST: 23 hours of wall clock later
        // minus the lost hour.
        assert_eq!(
            h.next_open(local("Europe/Paris", 2026, 3, 28, 18, 0)),
            utc(2026, 3, 29, 7, 0, 0)
        );
        assert_eq!(
            h.next_open(local("Europe/Paris", 2026, 10, 24, 18, 0)),
            utc(2026, 10, 25, 8, 0, 0)
        );
    }

    #[test]
    fn a_window_across_midnight() {
        let h = hours("22:00", "06:00", "Europe/Paris");
        let late = local("Europe/Paris", 2026, 6, 2, 23, 30);
        assert_eq!(h.next_open(late), late);
        let small_hours = local("Europe/Paris", 2026, 6, 3, 5, 59);
        assert_eq!(h.next_open(small_hours), small_hours);
        let at_end = local("Europe/Paris", 2026, 6, 3, 6, 0);
        assert_eq!(
            h.next_open(at_end),
            local("Europe/Paris", 2026, 6, 3, 22, 0)
        );
        let noon = local("Europe/Paris", 2026, 6, 3, 12, 0);
        assert_eq!(h.next_open(noon), local("Europe/Paris", 2026, 6, 3, 22, 0));
    }

    #[test]
    fn whole_day_windows_are_always_open() {
        for (start, end) in [("00:00", "24:00"), ("08:00", "08:00"), ("00:00", "00:00")] {
            let h = hours(start, end, "Europe/Paris");
            for at in [
                i64::MIN,
                -1,
                0,
                local("Europe/Paris", 2026, 6, 2, 23, 59) + 59_999,
                utc(2026, 3, 29, 1, 0, 0) - 1,
                utc(2026, 10, 25, 1, 0, 0),
                i64::MAX,
            ] {
                assert_eq!(h.next_open(at), at, "{start}-{end} at {at}");
            }
        }
    }

    #[test]
    fn a_start_inside_the_gap_opens_when_the_gap_ends() {
        let h = hours("02:30", "05:00", "Europe/Paris");
        let evening_before = local("Europe/Paris", 2026, 3, 28, 20, 0);
        // 03:00 CEST, the first real instant after 02:00 CET.
        assert_eq!(h.next_open(evening_before), utc(2026, 3, 29, 1, 0, 0));
        let just_before_gap = utc(2026, 3, 29, 1, 0, 0) - 1;
        assert_eq!(h.next_open(just_before_gap), utc(2026, 3, 29, 1, 0, 0));
        // And the day after, 02:30 CEST as normal.
        assert_eq!(
            h.next_open(utc(2026, 3, 29, 3, 0, 0)),
            utc(2026, 3, 30, 0, 30, 0)
        );
    }

    #[test]
    fn a_window_wholly_inside_the_gap_opens_the_next_day() {
        let h = hours("02:10", "02:50", "Europe/Paris");
        assert_eq!(
            h.next_open(local("Europe/Paris", 2026, 3, 28, 20, 0)),
            utc(2026, 3, 30, 0, 10, 0)
        );
    }

    #[test]
    fn windows_in_the_overlap_follow_the_wall_clock() {
        // 02:30 comes round twice; from inside the second pass the window opens again.
        let h = hours("02:30", "05:00", "Europe/Paris");
        let second_pass = utc(2026, 10, 25, 1, 10, 0); // 02:10 CET
        assert_eq!(h.next_open(second_pass), utc(2026, 10, 25, 1, 30, 0));
        let first_pass = utc(2026, 10, 25, 0, 10, 0); // 02:10 CEST
        assert_eq!(h.next_open(first_pass), utc(2026, 10, 25, 0, 30, 0));
        // The clock going back from 03:00 CEST to 02:00 CET lands inside 01:30-02:20.
        let jump_in = hours("01:30", "02:20", "Europe/Paris");
        let after_first_pass = utc(2026, 10, 25, 0, 40, 0); // 02:40 CEST
        assert_eq!(
            jump_in.next_open(after_first_pass),
            utc(2026, 10, 25, 1, 0, 0)
        );
    }

    #[test]
    fn active_hours_parse_errors_name_their_member() {
        let bad_start = [
            "24:00", "9:00", "09:0", "25:00", "12:60", "", "09:00 ", "ab:cd",
        ];
        for start in bad_start {
            let invalid = ActiveHours::parse(start, "17:00", Some("UTC")).unwrap_err();
            assert_eq!(invalid.member, "activeHours.start", "{start:?}");
        }
        for end in ["24:01", "25:00", "7", "17:00:00", "-1:00"] {
            let invalid = ActiveHours::parse("09:00", end, Some("UTC")).unwrap_err();
            assert_eq!(invalid.member, "activeHours.end", "{end:?}");
        }
        let tz = ActiveHours::parse("09:00", "17:00", Some("Mars/Base")).unwrap_err();
        assert_eq!(tz.member, "activeHours.tz");
        // No zone: the host's.
        assert!(ActiveHours::parse("09:00", "17:00", None).is_ok());
    }

    #[test]
    fn the_host_zone_agrees_with_chrono_local() {
        let h = ActiveHours::parse("09:00", "17:00", None).unwrap();
        let opens = h.next_open(NOW);
        assert!(opens >= NOW);
        let wall = DateTime::from_timestamp_millis(opens)
            .unwrap()
            .with_timezone(&chrono::Local)
            .format("%H:%M")
            .to_string();
        if opens == NOW {
            assert_eq!(h.next_open(NOW), NOW);
        } else {
            assert_eq!(wall, "09:00");
        }
    }

    // ---- nothing panics or hangs ----

    /// A small deterministic generator: odd strings, reproducible without a dependency.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    #[test]
    fn odd_input_never_panics() {
        let cron_atoms = [
            "*",
            "*/5",
            "5/5",
            "/5",
            "0",
            "59",
            "60",
            "1-5",
            "5-1",
            "L",
            "W",
            "15W",
            "LW",
            "5L",
            "5#2",
            "5#6",
            "#",
            "?",
            "+1",
            "+",
            ",",
            "-",
            "--",
            "1,2,3",
            "*/0",
            "0-59/61",
            "MON",
            "jan",
            "@daily",
            "@weekly",
            "@",
            "é",
            "\u{0}",
            "💥",
            "1/",
            "L-1",
            "31",
            "29",
            "2",
            "99999999999999999999",
            "-1",
            "7",
            "SUN-SAT",
            "0-7/2",
            "?/2",
            "*/-1",
        ];
        let usual_atoms = ["*", "*/7", "0", "5", "1-5", "L", "1,15", "2", "*/30"];
        let instants = [
            i64::MIN,
            -62_135_596_800_001, // just before year 1
            -1,
            0,
            NOW,
            95_617_584_000_000,  // year 5000
            253_402_300_799_999, // 9999-12-31T23:59:59.999Z
            i64::MAX,
        ];
        let zones = [
            None,
            Some("Europe/Paris"),
            Some("Pacific/Apia"),
            Some("Australia/Lord_Howe"),
        ];
        let mut rng = Lcg(15);
        let mut accepted = 0;
        for round in 0..600 {
            let fields = [5, 5, 5, 6, 6, 1, 7][(rng.next() % 7) as usize];
            let expr: Vec<&str> = (0..fields)
                .map(|_| {
                    if rng.next().is_multiple_of(4) {
                        rng.pick(&cron_atoms)
                    } else {
                        rng.pick(&usual_atoms)
                    }
                })
                .collect();
            let expr = expr.join(if round % 5 == 0 { "\t" } else { " " });
            let tz = zones[round % zones.len()];
            let spec = ScheduleSpec {
                expr: Some(&expr),
                tz,
                ..spec(Kind::Cron)
            };
            if let Ok(s) = Schedule::parse(&spec, NOW) {
                accepted += 1;
                for at in instants {
                    if let Some(next) = s.next_after(at, at) {
                        assert!(next > at, "{expr}: {next} after {at}");
                    }
                }
            }
        }
        assert!(accepted > 20, "only {accepted} expressions parsed");

        let at_atoms = [
            "2026", "-", "06", "01", "T", "12", ":", "00", ".", "5", "Z", "+", "02:00", "z", " ",
            "99", "0000", "9999", "\u{feff}", "é",
        ];
        for _ in 0..2_000 {
            let len = (rng.next() % 12) as usize;
            let at: String = (0..len).map(|_| rng.pick(&at_atoms)).collect();
            for tz in [None, Some("Europe/Paris")] {
                let spec = ScheduleSpec {
                    at: Some(&at),
                    tz,
                    ..spec(Kind::Once)
                };
                let _ = Schedule::parse(&spec, i64::MIN);
            }
        }
        for at in [
            "0000-01-01T00:00",
            "0000-01-01T00:00+23:59",
            "9999-12-31T23:59:59.999999999-23:59",
        ] {
            let spec = ScheduleSpec {
                at: Some(at),
                ..spec(Kind::Once)
            };
            let s = Schedule::parse(&spec, i64::MIN).unwrap();
            assert!(s.next_after(i64::MIN, 0).is_some());
        }

        let hh_atoms = ["00", "23", "24", "9", ":", "00:00", "24:00", "x", "", "💥"];
        for round in 0..500 {
            let start: String = (0..3).map(|_| rng.pick(&hh_atoms)).collect();
            let end: String = (0..3).map(|_| rng.pick(&hh_atoms)).collect();
            let _ = ActiveHours::parse(&start, &end, zones[round % zones.len()]);
        }
        for tz in [
            "Europe/Paris",
            "Pacific/Apia",
            "Australia/Lord_Howe",
            "America/St_Johns",
        ] {
            for (start, end) in [("00:00", "00:30"), ("23:59", "00:00"), ("02:30", "02:31")] {
                let h = hours(start, end, tz);
                for at in instants {
                    let opens = h.next_open(at);
                    assert!(opens >= at, "{tz} {start}-{end} at {at}: {opens}");
                }
            }
        }
    }

    #[test]
    fn samoa_skipping_a_whole_day_does_not_end_a_fixed_time_job() {
        // Croner alone answers nothing here: 30 December 09:00 lies in a 24-hour gap.
        let s = cron("0 9 * * *", Some("Pacific/Apia"));
        let before = utc(2011, 12, 29, 20, 0, 0); // 29 December 10:00 -10:00
        let Inner::Cron { cron: pattern, tz } = &s.inner else {
            panic!("not a cron schedule")
        };
        assert_eq!(cron_next(pattern, tz, before / 1_000), None);
        assert_eq!(
            fires(&s, before, 2),
            // 31 December 09:00 +14:00, then 1 January.
            ["2011-12-30T19:00:00.000Z", "2011-12-31T19:00:00.000Z"]
        );
        // A local `at` on the missing day lands where the day would have ended: the jump.
        let spec = ScheduleSpec {
            at: Some("2011-12-30T09:00"),
            tz: Some("Pacific/Apia"),
            ..spec(Kind::Once)
        };
        let once = Schedule::parse(&spec, before).unwrap();
        assert_at(once.next_after(before, 0), utc(2011, 12, 30, 10, 0, 0));
    }

    #[test]
    fn samoa_skipping_a_whole_day_does_not_trap_the_window() {
        // Pacific/Apia went from 2011-12-29 23:59:59 -10:00 to 2011-12-31 00:00 +14:00.
        let h = hours("09:00", "10:00", "Pacific/Apia");
        let before = utc(2011, 12, 30, 5, 0, 0); // 29 December 19:00 local
        let opens = h.next_open(before);
        assert_eq!(iso(opens), "2011-12-30T19:00:00.000Z"); // 31 December 09:00 +14:00
    }
}
