package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Scenario 12: a leader process (a candidate of an election, its term a lease of the
// election's name) paused with SIGSTOP past its TTL, then resumed. Two in-process candidates
// campaign meanwhile, are elected in turn and make fenced writes; the resumed leader keeps
// writing with its old term's token, and every such write must be rejected. The history
// checker holds the election to what it holds leases to: terms' tokens unique and rising, no
// write of an older term accepted after a newer term's first write, and the dead leader's
// writes rejected as stale.
func TestScenarioSIGSTOPLeader(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "12-sigstop-leader"})
	stale, _ := sigstopRuns(t, e, 2, "election", true)
	t.Logf("chaos: scenario=12-sigstop-leader stale_rejected=%d", stale)
	require.Positive(t, stale, "the resumed leader's writes must have been rejected as stale")
	logReport(t, e.report)
}
