package chaos

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Report accumulates what a scenario checked over its runs: runs, operations, violations and
// the measured lost-lock detection and takeover times. It is safe for concurrent use.
type Report struct {
	Scenario string

	mu         sync.Mutex
	runs, ops  int
	violations []Violation
	detect     []time.Duration
	takeover   []time.Duration
}

// AddRun adds one checked run: its history's operation count and the violations found.
func (r *Report) AddRun(h History, vs []Violation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs++
	r.ops += len(h)
	r.violations = append(r.violations, vs...)
}

// AddDetect adds a lost-lock detection time: from the server-side loss (expiry, takeover or
// the fault) to the holder's Done closing.
func (r *Report) AddDetect(d ...time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detect = append(r.detect, d...)
}

// AddTakeover adds a takeover time: from a holder's crash to the next grant.
func (r *Report) AddTakeover(d ...time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.takeover = append(r.takeover, d...)
}

// Violations returns the violations found so far.
func (r *Report) Violations() []Violation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.violations)
}

// Line renders the report as one parseable line:
//
//	chaos: scenario=<name> runs=N ops=M violations=V detect_n=.. detect_p50=.. detect_p99=.. detect_max=.. takeover_n=.. takeover_p50=.. takeover_p99=.. takeover_max=..
func (r *Report) Line() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: scenario=%s runs=%d ops=%d violations=%d", r.Scenario, r.runs, r.ops, len(r.violations))
	for _, s := range []struct {
		name string
		ds   []time.Duration
	}{{"detect", r.detect}, {"takeover", r.takeover}} {
		if len(s.ds) == 0 {
			fmt.Fprintf(&b, " %s_n=0 %s_p50=- %s_p99=- %s_max=-", s.name, s.name, s.name, s.name)
			continue
		}
		p50, p99, top := Percentiles(s.ds)
		fmt.Fprintf(&b, " %s_n=%d %s_p50=%s %s_p99=%s %s_max=%s", s.name, len(s.ds), s.name, fmtDur(p50), s.name, fmtDur(p99), s.name, fmtDur(top))
	}
	return b.String()
}

func fmtDur(d time.Duration) string {
	return d.Round(100 * time.Microsecond).String()
}

// Percentiles returns the 50th and 99th percentiles (nearest rank) and the maximum of ds,
// or -1 for each when ds is empty.
func Percentiles(ds []time.Duration) (p50, p99, top time.Duration) {
	if len(ds) == 0 {
		return -1, -1, -1
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return rank(0.50), rank(0.99), s[len(s)-1]
}
