package integration

import (
	"slices"
	"testing"
	"time"

	"github.com/fencelock/fencelock"
)

// BenchmarkElection: the time to a new leader (its Campaign returned: elected and its value
// proclaimed), p50 and p99.
//   - Resign: from the start of the leader's Resign, with a candidate already waiting (the
//     release hands the term over and NOTIFY wakes the candidate); target p50 <= 10 ms.
//   - Crash: the leader stops renewing (as a crashed process does; TTL 1 s) with a candidate
//     waiting; from the term's expiry on the database clock (the same host's clock here);
//     target p99 <= 100 ms. Each iteration takes the TTL: run with -benchtime 20x.
func BenchmarkElection(b *testing.B) {
	b.Run("Resign", func(b *testing.B) {
		e := benchSetup(b)
		leader, _ := fencelock.NewLessor(e.pool)
		candidate, _ := fencelock.NewLessor(e.pool)
		el, _ := fencelock.NewElection(leader, "bench-election", time.Minute)
		ec, _ := fencelock.NewElection(candidate, "bench-election", time.Minute)
		handoff(b, heldTerm(e.ctx, el, "leader"), heldTerm(e.ctx, ec, "candidate"))
	})
	b.Run("Crash", func(b *testing.B) {
		e := benchSetup(b)
		const ttl = time.Second
		candidate, _ := fencelock.NewLessor(e.pool)
		ec, _ := fencelock.NewElection(candidate, "bench-crash", ttl)
		var lat []time.Duration
		for b.Loop() {
			dead, _ := fencelock.NewLessor(e.pool, fencelock.WithoutHeartbeat())
			ed, _ := fencelock.NewElection(dead, "bench-crash", ttl)
			td, err := ed.Campaign(e.ctx, "dead")
			if err != nil {
				b.Fatal(err)
			}
			t, err := ec.Campaign(e.ctx, "heir")
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(td.Lease().ExpiresAt()))
			if err := t.Resign(e.ctx); err != nil {
				b.Fatal(err)
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms-after-expiry")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms-after-expiry")
	})
}
