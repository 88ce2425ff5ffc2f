//! Where the time went: the stage bar (model load, decode/resample, mel, encoder, prefill,
//! decode steps, with milliseconds and the real-time factor) and the per-kernel table from
//! GPU timestamp queries (or, without them, a note saying why there are only stage times).
//! The same records feed `verbatim transcribe --timings --kernels`.

use eframe::egui::{self, Color32, RichText, Sense, Stroke, Ui};
use engine::gpu::KernelStat;

use super::worker::FileResult;

/// The stages drawn in the bar: (label, colour, seconds).
pub fn stages(r: &FileResult) -> Vec<(&'static str, Color32, f64)> {
    let stage = |name: &str| r.transcript.stage_seconds(name);
    vec![
        ("model load", Color32::from_rgb(0x8c, 0x8c, 0x8c), r.load_seconds),
        ("decode + resample", Color32::from_rgb(0x4e, 0x79, 0xa7), stage("audio decode") + stage("resample")),
        ("mel", Color32::from_rgb(0xf2, 0x8e, 0x2b), stage("mel")),
        ("encoder", Color32::from_rgb(0xe1, 0x57, 0x59), stage("encoder")),
        ("prefill", Color32::from_rgb(0x76, 0xb7, 0xb2), stage("prefill")),
        ("decode", Color32::from_rgb(0x59, 0xa1, 0x4f), stage("decode steps")),
    ]
}

pub fn stage_bar(ui: &mut Ui, r: &FileResult) {
    let stages = stages(r);
    let total: f64 = stages.iter().map(|s| s.2).sum();
    let width = ui.available_width().max(100.0);
    let (rect, _) = ui.allocate_exact_size(egui::vec2(width, 22.0), Sense::hover());
    let painter = ui.painter_at(rect);
    painter.rect_filled(rect, 3.0, ui.visuals().extreme_bg_color);
    if total > 0.0 {
        let mut x = rect.left();
        for (name, colour, secs) in &stages {
            let w = (secs / total) as f32 * rect.width();
            if w <= 0.0 {
                continue;
            }
            let seg = egui::Rect::from_min_size(egui::pos2(x, rect.top()), egui::vec2(w, rect.height()));
            painter.rect_filled(seg, 0.0, *colour);
            if w > 60.0 {
                painter.text(seg.center(), egui::Align2::CENTER_CENTER, *name, egui::FontId::proportional(11.0), Color32::WHITE);
            }
            x += w;
        }
    }
    painter.rect_stroke(rect, 3.0, Stroke::new(1.0, ui.visuals().widgets.noninteractive.bg_stroke.color), egui::StrokeKind::Inside);
    ui.horizontal_wrapped(|ui| {
        for (name, colour, secs) in &stages {
            let (r, _) = ui.allocate_exact_size(egui::vec2(10.0, 10.0), Sense::hover());
            ui.painter().rect_filled(r, 1.0, *colour);
            ui.label(format!("{name} {:.1} ms", secs * 1e3));
            ui.add_space(6.0);
        }
    });
    let t = &r.transcript;
    ui.label(format!(
        "total {:.1} ms for {:.2} s of audio: real-time factor {:.4} ({}); {} tokens, {} windows",
        t.total_seconds() * 1e3,
        t.audio_seconds,
        t.real_time_factor(),
        speed_words(t.real_time_factor()),
        t.tokens,
        t.windows
    ));
    if t.speculative != engine::decode::draft::Speculative::Off {
        ui.label(crate::transcribe::speculative_line(t.speculative, &t.spec));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SortBy {
    Kernel,
    Stage,
    Dispatches,
    #[default]
    Total,
    Mean,
    Bytes,
    Bandwidth,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Sort {
    pub by: SortBy,
    pub ascending: bool,
}

fn mean_ns(k: &KernelStat) -> f64 {
    k.gpu_ns / k.dispatches.max(1) as f64
}

fn gbps(k: &KernelStat) -> f64 {
    if k.gpu_ns > 0.0 { k.bytes as f64 / k.gpu_ns } else { 0.0 }
}

/// The rows in the chosen order.
pub fn sorted(stats: &[KernelStat], sort: Sort) -> Vec<KernelStat> {
    let mut rows = stats.to_vec();
    let key = |a: &KernelStat, b: &KernelStat| -> std::cmp::Ordering {
        match sort.by {
            SortBy::Kernel => a.kernel.cmp(b.kernel),
            SortBy::Stage => a.stage.cmp(b.stage),
            SortBy::Dispatches => a.dispatches.cmp(&b.dispatches),
            SortBy::Total => a.gpu_ns.total_cmp(&b.gpu_ns),
            SortBy::Mean => mean_ns(a).total_cmp(&mean_ns(b)),
            SortBy::Bytes => a.bytes.cmp(&b.bytes),
            SortBy::Bandwidth => gbps(a).total_cmp(&gbps(b)),
        }
    };
    rows.sort_by(|a, b| if sort.ascending { key(a, b) } else { key(b, a) });
    rows
}

pub fn kernel_table(ui: &mut Ui, r: &FileResult, adapter: &str, sort: &mut Sort) {
    if !r.timed {
        ui.label(
            RichText::new(format!(
                "{adapter} offers no GPU timestamp queries (TIMESTAMP_QUERY and \
                 TIMESTAMP_QUERY_INSIDE_PASSES): per-kernel GPU times are unavailable, the stage \
                 bar above shows CPU-side times. Dispatch counts and bytes are still listed."
            ))
            .color(ui.visuals().warn_fg_color),
        );
    }
    let total_ns: f64 = r.kernels.iter().map(|k| k.gpu_ns).sum();
    let dispatches: u64 = r.kernels.iter().map(|k| k.dispatches).sum();
    ui.label(format!("{dispatches} dispatches, {:.3} ms of GPU time", total_ns / 1e6));
    let rows = sorted(&r.kernels, *sort);
    egui::ScrollArea::both().id_salt("kernels").auto_shrink([false, true]).max_height(ui.available_height()).show(ui, |ui| {
        egui::Grid::new("kernel-grid").striped(true).num_columns(8).spacing([14.0, 3.0]).show(ui, |ui| {
            let header = |ui: &mut Ui, label: &str, by: SortBy, sort: &mut Sort| {
                let arrow = if sort.by == by { if sort.ascending { " ^" } else { " v" } } else { "" };
                if ui.button(RichText::new(format!("{label}{arrow}")).strong()).clicked() {
                    if sort.by == by {
                        sort.ascending = !sort.ascending;
                    } else {
                        *sort = Sort { by, ascending: matches!(by, SortBy::Kernel | SortBy::Stage) };
                    }
                }
            };
            header(ui, "kernel", SortBy::Kernel, sort);
            header(ui, "stage", SortBy::Stage, sort);
            header(ui, "dispatches", SortBy::Dispatches, sort);
            header(ui, "GPU ms", SortBy::Total, sort);
            header(ui, "mean µs", SortBy::Mean, sort);
            header(ui, "MB moved", SortBy::Bytes, sort);
            header(ui, "GB/s", SortBy::Bandwidth, sort);
            ui.label(RichText::new("share").strong());
            ui.end_row();
            for k in &rows {
                let share = if total_ns > 0.0 { 100.0 * k.gpu_ns / total_ns } else { 0.0 };
                ui.monospace(k.kernel);
                ui.label(k.stage);
                ui.label(format!("{}", k.dispatches));
                ui.label(format!("{:.3}", k.gpu_ns / 1e6));
                ui.label(format!("{:.1}", mean_ns(k) / 1e3));
                ui.label(format!("{:.2}", k.bytes as f64 / 1e6));
                ui.label(format!("{:.1}", gbps(k)));
                ui.label(format!("{share:.1}%"));
                ui.end_row();
            }
        });
    });
}

/// "40x faster than real time" / "2.5x slower than real time".
fn speed_words(rtf: f64) -> String {
    if !(rtf > 0.0) {
        String::from("no time measured")
    } else if rtf <= 1.0 {
        format!("{:.1}x faster than real time", 1.0 / rtf)
    } else {
        format!("{rtf:.1}x slower than real time")
    }
}
