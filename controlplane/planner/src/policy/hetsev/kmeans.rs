//! Deterministic k-means under the L1 distance, for Algorithm 1 line 1 (Sec. 4.2, Step 1:
//! "we leverage the L1 Distance metric to identify similar instances ... we use the k-means
//! algorithm").
//!
//! Ambiguity resolved: the paper pairs k-means with the L1 distance without saying how the
//! centres are updated. The centre that minimises a cluster's summed L1 distance is the
//! coordinate-wise *median*, so each Lloyd iteration assigns by L1 and re-centres on the
//! median (k-medians). Both steps never increase the summed L1 distance, so the loop settles;
//! `max_iters` bounds it anyway. Initialisation is farthest-first (the first point, then
//! repeatedly the point farthest from its nearest chosen centre, ties to the lowest index),
//! so the result depends only on the input order: no seed is needed.

/// L1 (Manhattan) distance.
pub fn l1(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum()
}

/// A clustering: `assignments[p]` is the cluster of point `p`; clusters are numbered in
/// order of their first point, and none is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct Clustering {
    pub assignments: Vec<usize>,
    pub centroids: Vec<Vec<f64>>,
    /// Lloyd iterations run (assignment + update).
    pub iterations: usize,
}

impl Clustering {
    /// Point indices per cluster, each in ascending order.
    pub fn members(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.centroids.len()];
        for (p, &c) in self.assignments.iter().enumerate() {
            out[c].push(p);
        }
        out
    }
}

/// Clusters `points` (all of one dimension) into at most `k` clusters. Fewer come back when
/// there are fewer distinct points than `k`. `k == 0` is treated as 1.
pub fn kmeans_l1(points: &[Vec<f64>], k: usize, max_iters: usize) -> Clustering {
    if points.is_empty() {
        return Clustering { assignments: Vec::new(), centroids: Vec::new(), iterations: 0 };
    }
    let mut centroids = farthest_first(points, k.max(1));
    let mut assignments = vec![usize::MAX; points.len()];
    let mut iterations = 0;
    while iterations < max_iters.max(1) {
        iterations += 1;
        let next: Vec<usize> = points.iter().map(|p| nearest(&centroids, p)).collect();
        let changed = next != assignments;
        assignments = next;
        if !changed {
            break;
        }
        for (c, centroid) in centroids.iter_mut().enumerate() {
            let members: Vec<&Vec<f64>> = points.iter().zip(&assignments).filter(|(_, &a)| a == c).map(|(p, _)| p).collect();
            if !members.is_empty() {
                *centroid = median(&members);
            }
        }
    }
    // Drop empty clusters and renumber by first appearance.
    let mut relabel = vec![usize::MAX; centroids.len()];
    let mut kept = Vec::new();
    for a in assignments.iter_mut() {
        if relabel[*a] == usize::MAX {
            relabel[*a] = kept.len();
            kept.push(centroids[*a].clone());
        }
        *a = relabel[*a];
    }
    Clustering { assignments, centroids: kept, iterations }
}

fn nearest(centroids: &[Vec<f64>], p: &[f64]) -> usize {
    let mut best = (0, f64::INFINITY);
    for (c, centroid) in centroids.iter().enumerate() {
        let d = l1(centroid, p);
        if d < best.1 {
            best = (c, d);
        }
    }
    best.0
}

fn farthest_first(points: &[Vec<f64>], k: usize) -> Vec<Vec<f64>> {
    let mut centroids = vec![points[0].clone()];
    let mut dist: Vec<f64> = points.iter().map(|p| l1(p, &points[0])).collect();
    while centroids.len() < k {
        let (far, d) = dist.iter().enumerate().fold((0, 0.0), |best, (i, &d)| if d > best.1 { (i, d) } else { best });
        if d <= 0.0 {
            break; // every point coincides with a centre already
        }
        centroids.push(points[far].clone());
        for (i, p) in points.iter().enumerate() {
            dist[i] = dist[i].min(l1(p, &points[far]));
        }
    }
    centroids
}

/// Coordinate-wise median (mean of the two middle values for an even count).
fn median(members: &[&Vec<f64>]) -> Vec<f64> {
    let dim = members[0].len();
    (0..dim)
        .map(|d| {
            let mut v: Vec<f64> = members.iter().map(|p| p[d]).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(xs: &[f64]) -> Vec<Vec<f64>> {
        xs.iter().map(|&x| vec![x]).collect()
    }

    #[test]
    fn two_obvious_groups_in_one_dimension() {
        let c = kmeans_l1(&pts(&[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]), 2, 50);
        assert_eq!(c.members(), vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert_eq!(c.centroids, vec![vec![1.0], vec![11.0]]);
    }

    #[test]
    fn median_update_recentres_clusters() {
        // Farthest-first seeds 0.0 and 9.0; 4.0 joins the 0-centre (4 < 5); the median
        // update moves the centres to 1.0 and 8.5 and the assignment is then stable.
        let c = kmeans_l1(&pts(&[0.0, 1.0, 4.0, 8.0, 9.0]), 2, 50);
        assert_eq!(c.members(), vec![vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(c.centroids, vec![vec![1.0], vec![8.5]]);
        assert_eq!(c.iterations, 2);
    }

    #[test]
    fn fewer_distinct_points_than_k_gives_fewer_clusters() {
        let c = kmeans_l1(&pts(&[3.0, 3.0, 3.0]), 4, 10);
        assert_eq!(c.centroids.len(), 1);
        assert_eq!(c.assignments, vec![0, 0, 0]);
    }

    #[test]
    fn empty_input_is_empty() {
        let c = kmeans_l1(&[], 3, 10);
        assert!(c.assignments.is_empty() && c.centroids.is_empty());
    }
}
