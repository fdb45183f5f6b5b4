//! MIG geometry: profile tables per GPU model, placement validation, enumeration of maximal
//! layouts and a minimal transition planner between two layouts.
//!
//! The geometry follows NVIDIA's placement rules for 7-compute / 8-memory-slice GPUs (A100,
//! H100, H200): two instances may not share a memory slice, the compute slices used may not
//! exceed 7, and every profile may only start at its listed slots. With the 1g/2g/3g/4g/7g
//! profiles this yields exactly the 19 maximal layouts of ParvaGPU Fig. 1.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// Number of compute slices (GPCs) of a MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;
/// Number of memory slices of a MIG-capable GPU.
pub const MEMORY_SLICES: u8 = 8;

/// GPU models whose MIG geometry the planner knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuModel {
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H200,
    /// A GPU without MIG (e.g. V100, T4): MPS only.
    NoMig,
}

impl GpuModel {
    /// The geometry of a GPU named as a GpuModel resource, by family: `A100-80GB`,
    /// `H100-80GB`, `H200`; `V100-16GB`, `T4-16GB`, `A10`, `L4` have no MIG. `None` for a
    /// family the planner does not know.
    pub fn for_name(name: &str) -> Option<GpuModel> {
        let family = |prefix: &str| name == prefix || name.starts_with(&format!("{prefix}-"));
        Some(if family("A100-40GB") {
            GpuModel::A100_40GB
        } else if family("A100-80GB") || family("A100") {
            GpuModel::A100_80GB
        } else if family("H100-80GB") || family("H100") {
            GpuModel::H100_80GB
        } else if family("H200") {
            GpuModel::H200
        } else if ["V100", "T4", "A10", "L4"].iter().any(|f| family(f)) {
            GpuModel::NoMig
        } else {
            return None;
        })
    }
}

/// The MIG profiles, identified by geometry rather than by memory size so that the same id
/// means the same placement rules on every model (the memory size is in [`ProfileSpec::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MigProfile {
    /// 1 compute slice, 1 memory slice.
    G1,
    /// 1 compute slice, 2 memory slices (e.g. `1g.20gb` on A100-80GB).
    G1Mem2,
    G2,
    G3,
    G4,
    G7,
}

impl MigProfile {
    pub const ALL: [MigProfile; 6] = [MigProfile::G1, MigProfile::G1Mem2, MigProfile::G2, MigProfile::G3, MigProfile::G4, MigProfile::G7];
    /// The profiles ParvaGPU uses (one per instance size 1, 2, 3, 4, 7 GPCs).
    pub const PARVA: [MigProfile; 5] = [MigProfile::G1, MigProfile::G2, MigProfile::G3, MigProfile::G4, MigProfile::G7];

    /// Compute slices (GPCs).
    pub fn compute(self) -> u8 {
        match self {
            MigProfile::G1 | MigProfile::G1Mem2 => 1,
            MigProfile::G2 => 2,
            MigProfile::G3 => 3,
            MigProfile::G4 => 4,
            MigProfile::G7 => 7,
        }
    }

    /// Memory slices occupied.
    pub fn memory_slices(self) -> u8 {
        match self {
            MigProfile::G1 => 1,
            MigProfile::G1Mem2 | MigProfile::G2 => 2,
            MigProfile::G3 | MigProfile::G4 => 4,
            MigProfile::G7 => 8,
        }
    }

    /// Legal start slots (memory-slice index of the first slice).
    pub fn legal_starts(self) -> &'static [u8] {
        match self {
            MigProfile::G1 => &[0, 1, 2, 3, 4, 5, 6],
            MigProfile::G1Mem2 => &[0, 2, 4, 6],
            MigProfile::G2 => &[0, 2, 4],
            MigProfile::G3 => &[0, 4],
            MigProfile::G4 | MigProfile::G7 => &[0],
        }
    }

    /// The 1-mem-slice profile for an instance size in GPCs, as used by ParvaGPU.
    pub fn for_gpcs(gpcs: u8) -> Option<MigProfile> {
        match gpcs {
            1 => Some(MigProfile::G1),
            2 => Some(MigProfile::G2),
            3 => Some(MigProfile::G3),
            4 => Some(MigProfile::G4),
            7 => Some(MigProfile::G7),
            _ => None,
        }
    }

    /// Bit mask of the memory slices an instance at `start` occupies.
    pub fn memory_mask(self, start: u8) -> u8 {
        let width = self.memory_slices();
        let ones: u16 = (1u16 << width) - 1;
        ((ones << start) & 0xff) as u8
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            MigProfile::G1 => "1g",
            MigProfile::G1Mem2 => "1g(2 mem slices)",
            MigProfile::G2 => "2g",
            MigProfile::G3 => "3g",
            MigProfile::G4 => "4g",
            MigProfile::G7 => "7g",
        };
        f.write_str(s)
    }
}

/// One row of a GPU model's profile table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileSpec {
    pub profile: MigProfile,
    /// NVIDIA's name on this model, e.g. `3g.40gb`.
    pub name: String,
    pub memory_gib: f64,
}

/// The MIG profile table of a GPU model, kept as data so that a model read from NVML can be
/// represented the same way.
pub fn profile_table(model: GpuModel) -> Vec<ProfileSpec> {
    // Memory per slice (GiB) differs per model; ids and placements do not.
    let (slice_gib, suffix): (f64, fn(f64) -> String) = match model {
        GpuModel::A100_40GB => (5.0, |g| format!("{g}gb")),
        GpuModel::A100_80GB | GpuModel::H100_80GB => (10.0, |g| format!("{g}gb")),
        GpuModel::H200 => (17.75, |g| format!("{g}gb")),
        GpuModel::NoMig => return Vec::new(),
    };
    MigProfile::ALL
        .iter()
        .map(|&p| {
            let mem = slice_gib * f64::from(p.memory_slices());
            let shown = if model == GpuModel::H200 {
                // NVIDIA rounds H200 sizes to 18/35/71/141 GB.
                match p.memory_slices() {
                    1 => 18.0,
                    2 => 35.0,
                    4 => 71.0,
                    _ => 141.0,
                }
            } else {
                mem
            };
            ProfileSpec { profile: p, name: format!("{}g.{}", p.compute(), suffix(shown)), memory_gib: mem }
        })
        .collect()
}

/// An instance of a layout: a profile at an explicit start slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub profile: MigProfile,
    pub start: u8,
}

impl Placement {
    pub fn new(profile: MigProfile, start: u8) -> Self {
        Placement { profile, start }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// Why a layout is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    #[error("profile {profile} may not start at slot {start} (legal starts: {legal:?})")]
    IllegalStart { profile: MigProfile, start: u8, legal: Vec<u8> },
    #[error("instances {a} and {b} overlap in memory slices")]
    Overlap { a: Placement, b: Placement },
    #[error("layout uses {used} compute slices, more than the {max} available")]
    ComputeExceeded { used: u8, max: u8 },
    #[error("unknown MIG profile `{0}`")]
    UnknownProfile(String),
    #[error("GPU model {0:?} does not support MIG")]
    NoMig(GpuModel),
}

/// Parses a profile name such as `3g`, `3g.40gb` or `1g.20gb` for a model.
pub fn parse_profile(model: GpuModel, name: &str) -> Result<MigProfile, MigError> {
    let table = profile_table(model);
    if table.is_empty() {
        return Err(MigError::NoMig(model));
    }
    if let Some(spec) = table.iter().find(|s| s.name == name) {
        return Ok(spec.profile);
    }
    match name {
        "1g" => Ok(MigProfile::G1),
        "2g" => Ok(MigProfile::G2),
        "3g" => Ok(MigProfile::G3),
        "4g" => Ok(MigProfile::G4),
        "7g" => Ok(MigProfile::G7),
        _ => Err(MigError::UnknownProfile(name.to_string())),
    }
}

/// Validates a layout: legal starts, compute slices within 7, no memory overlap (checked in
/// that order, so an over-full layout reports the compute excess rather than the first
/// overlap). With this geometry a layout without overlaps never exceeds 7 compute slices; the
/// compute check still matters for layouts that also overlap and for other tables.
pub fn validate(layout: &[Placement]) -> Result<(), MigError> {
    for p in layout {
        if !p.profile.legal_starts().contains(&p.start) {
            return Err(MigError::IllegalStart { profile: p.profile, start: p.start, legal: p.profile.legal_starts().to_vec() });
        }
    }
    let compute: u32 = layout.iter().map(|p| u32::from(p.profile.compute())).sum();
    if compute > u32::from(COMPUTE_SLICES) {
        return Err(MigError::ComputeExceeded { used: compute.min(255) as u8, max: COMPUTE_SLICES });
    }
    for (i, p) in layout.iter().enumerate() {
        for q in &layout[..i] {
            if p.profile.memory_mask(p.start) & q.profile.memory_mask(q.start) != 0 {
                return Err(MigError::Overlap { a: *q, b: *p });
            }
        }
    }
    Ok(())
}

/// Occupancy of one GPU, for fast incremental placement (memory mask + compute used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub memory: u8,
    pub compute: u8,
}

impl Occupancy {
    pub fn of(layout: &[Placement]) -> Self {
        let mut o = Occupancy::default();
        for p in layout {
            o.add(*p);
        }
        o
    }
    pub fn fits(&self, p: Placement) -> bool {
        p.profile.legal_starts().contains(&p.start)
            && self.memory & p.profile.memory_mask(p.start) == 0
            && self.compute + p.profile.compute() <= COMPUTE_SLICES
    }
    pub fn add(&mut self, p: Placement) {
        self.memory |= p.profile.memory_mask(p.start);
        self.compute += p.profile.compute();
    }
    pub fn remove(&mut self, p: Placement) {
        self.memory &= !p.profile.memory_mask(p.start);
        self.compute -= p.profile.compute();
    }
    /// First start among `preferred` at which `profile` fits.
    pub fn first_fit(&self, profile: MigProfile, preferred: &[u8]) -> Option<u8> {
        preferred.iter().copied().find(|&s| self.fits(Placement::new(profile, s)))
    }
}

/// Enumerates every maximal layout (no further instance of an allowed profile fits) built from
/// `profiles`. Layouts are returned sorted, each sorted by start.
pub fn maximal_layouts(profiles: &[MigProfile]) -> Vec<Vec<Placement>> {
    let candidates: Vec<Placement> = profiles.iter().flat_map(|&p| p.legal_starts().iter().map(move |&s| Placement::new(p, s))).collect();
    let mut out = BTreeSet::new();
    let mut current = Vec::new();
    fn rec(cands: &[Placement], from: usize, occ: Occupancy, current: &mut Vec<Placement>, out: &mut BTreeSet<Vec<Placement>>) {
        let mut extended = false;
        for i in from..cands.len() {
            if occ.fits(cands[i]) {
                extended = true;
                let mut o = occ;
                o.add(cands[i]);
                current.push(cands[i]);
                rec(cands, i + 1, o, current, out);
                current.pop();
            }
        }
        // Only a layout to which no candidate at all (also earlier ones) can be added is maximal.
        if !extended && cands.iter().all(|c| !occ.fits(*c)) {
            let mut l = current.clone();
            l.sort_by_key(|p| (p.start, p.profile));
            out.insert(l);
        }
    }
    rec(&candidates, 0, Occupancy::default(), &mut current, &mut out);
    out.into_iter().collect()
}

/// One step of a MIG transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigOp {
    Destroy(Placement),
    Create(Placement),
}

/// The operations that turn `current` into `target`: destroy first (freeing slices), then
/// create. An instance with the same profile and start in both is never touched, and no other
/// instance is touched either, so this is the minimum number of operations.
pub fn plan_transition(current: &[Placement], target: &[Placement]) -> Result<Vec<MigOp>, MigError> {
    validate(target)?;
    let cur: BTreeSet<Placement> = current.iter().copied().collect();
    let tgt: BTreeSet<Placement> = target.iter().copied().collect();
    let mut ops: Vec<MigOp> = cur.difference(&tgt).map(|p| MigOp::Destroy(*p)).collect();
    ops.extend(tgt.difference(&cur).map(|p| MigOp::Create(*p)));
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use MigProfile::*;

    fn p(profile: MigProfile, start: u8) -> Placement {
        Placement::new(profile, start)
    }

    #[test]
    fn gpu_names_match_by_family() {
        assert_eq!(GpuModel::for_name("T4-16GB"), Some(GpuModel::NoMig));
        assert_eq!(GpuModel::for_name("A100-80GB"), Some(GpuModel::A100_80GB));
        assert_eq!(GpuModel::for_name("A100-40GB"), Some(GpuModel::A100_40GB));
        assert_eq!(GpuModel::for_name("H100-80GB"), Some(GpuModel::H100_80GB));
        assert_eq!(GpuModel::for_name("T40"), None);
    }

    #[test]
    fn parva_profiles_give_exactly_19_maximal_layouts() {
        let layouts = maximal_layouts(&MigProfile::PARVA);
        assert_eq!(layouts.len(), 19);
        for l in &layouts {
            validate(l).unwrap();
        }
        // Spot checks from Fig. 1: 7, 4-3, 4-2-1, 4-1-1-1, 3-3 and seven 1g.
        let sizes: BTreeSet<Vec<u8>> = layouts
            .iter()
            .map(|l| {
                let mut s: Vec<u8> = l.iter().map(|p| p.profile.compute()).collect();
                s.sort_unstable_by(|a, b| b.cmp(a));
                s
            })
            .collect();
        for want in [vec![7], vec![4, 3], vec![4, 2, 1], vec![4, 1, 1, 1], vec![3, 3], vec![1; 7]] {
            assert!(sizes.contains(&want), "{want:?} missing");
        }
        assert!(layouts.contains(&vec![p(G3, 0), p(G3, 4)]));
    }

    #[test]
    fn mem2_profile_adds_layouts() {
        let with = maximal_layouts(&MigProfile::ALL);
        assert!(with.len() > 19);
        assert!(with.iter().all(|l| validate(l).is_ok()));
        assert!(with.contains(&vec![p(G1Mem2, 0), p(G1Mem2, 2), p(G1Mem2, 4), p(G1Mem2, 6)]));
    }

    #[test]
    fn validation_errors_are_precise() {
        assert_eq!(validate(&[p(G3, 2)]), Err(MigError::IllegalStart { profile: G3, start: 2, legal: vec![0, 4] }));
        assert_eq!(validate(&[p(G4, 0), p(G2, 2)]), Err(MigError::Overlap { a: p(G4, 0), b: p(G2, 2) }));
        assert_eq!(
            validate(&[p(G7, 0), p(G1, 7)]),
            Err(MigError::IllegalStart { profile: G1, start: 7, legal: vec![0, 1, 2, 3, 4, 5, 6] })
        );
        // 3g@0 + 3g@4 is valid; adding the 1g that would bring compute to 7 has no slot left.
        validate(&[p(G3, 0), p(G3, 4)]).unwrap();
        assert!(matches!(validate(&[p(G3, 0), p(G3, 4), p(G1, 3)]), Err(MigError::Overlap { .. })));
        // Seven 1g plus a 1g.2mem at 6 overlaps; 1g at 0..6 + nothing else is compute 7.
        let seven: Vec<_> = (0..7).map(|s| p(G1, s)).collect();
        validate(&seven).unwrap();
        assert_eq!(parse_profile(GpuModel::A100_80GB, "5g"), Err(MigError::UnknownProfile("5g".into())));
        assert_eq!(parse_profile(GpuModel::A100_80GB, "3g.40gb"), Ok(G3));
        assert_eq!(parse_profile(GpuModel::A100_40GB, "1g.10gb"), Ok(G1Mem2));
        assert_eq!(parse_profile(GpuModel::NoMig, "1g"), Err(MigError::NoMig(GpuModel::NoMig)));
    }

    #[test]
    fn compute_limit_is_enforced() {
        assert_eq!(validate(&[p(G7, 0), p(G1, 0)]), Err(MigError::ComputeExceeded { used: 8, max: 7 }));
        let six_plus_wide = [p(G1, 0), p(G1, 1), p(G1, 2), p(G1, 3), p(G1, 4), p(G1, 5), p(G1Mem2, 6)];
        validate(&six_plus_wide).unwrap();
        let mut occ = Occupancy::of(&six_plus_wide);
        assert_eq!(occ.compute, 7);
        assert!(!occ.fits(p(G1, 6)));
        occ.remove(p(G1Mem2, 6));
        assert!(occ.fits(p(G1, 6)));
    }

    #[test]
    fn profile_tables_per_model() {
        let a40 = profile_table(GpuModel::A100_40GB);
        assert!(a40.iter().any(|s| s.name == "3g.20gb" && s.profile == G3));
        let a80 = profile_table(GpuModel::A100_80GB);
        assert!(a80.iter().any(|s| s.name == "7g.80gb"));
        let h200 = profile_table(GpuModel::H200);
        assert!(h200.iter().any(|s| s.name == "1g.18gb" && s.profile == G1));
        assert!(profile_table(GpuModel::NoMig).is_empty());
    }

    #[test]
    fn transition_keeps_unchanged_instances() {
        let current = [p(G4, 0), p(G2, 4), p(G1, 6)];
        let target = [p(G4, 0), p(G1, 4), p(G1, 5), p(G1, 6)];
        let ops = plan_transition(&current, &target).unwrap();
        assert_eq!(ops, vec![MigOp::Destroy(p(G2, 4)), MigOp::Create(p(G1, 4)), MigOp::Create(p(G1, 5))]);
        assert!(plan_transition(&current, &current).unwrap().is_empty());
        assert!(plan_transition(&current, &[p(G3, 1)]).is_err());
    }
}
