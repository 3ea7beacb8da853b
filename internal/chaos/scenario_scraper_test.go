package chaos

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Scenario 15: examples/scraper, run as a user would: three worker processes over 10 accounts
// (a lease each) and 3 domains (a semaphore of 2 and a rate limit of 25/s each), one process
// paused (SIGSTOP) past the TTL a quarter in. The example checks from the database that no
// domain ever had more than 2 requests in flight or more than 25 allowed in a second, and that
// no account was used by two workers at once; it exits non-zero otherwise, and its last line
// counts them.
func TestScenarioScraperExample(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "15-scraper-example"})
	bin := filepath.Join(t.TempDir(), "scraper")
	out, err := exec.CommandContext(e.ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/scraper").CombinedOutput()
	require.NoError(t, err, "%s", out)
	run := exec.CommandContext(e.ctx, bin)
	run.Env = append(os.Environ(), "DATABASE_URL="+e.db.URL, "FENCELOCK_SCRAPER_SECONDS=4")
	run.Cancel = func() error { return run.Process.Signal(syscall.SIGTERM) } // it stops its workers
	run.WaitDelay = 15 * time.Second
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`^scraper: requests=(\d+) max_concurrent_per_domain=(\d+) cap=(\d+) max_rate_per_domain=(\d+) limit=(\d+) double_account_use=0$`).FindStringSubmatch(last)
	require.NotNil(t, m, "last line: %s\n%s", last, out)
	n := make([]int, len(m))
	for i := 1; i < len(m); i++ {
		n[i], _ = strconv.Atoi(m[i])
	}
	require.Positive(t, n[1], "requests")
	require.LessOrEqual(t, n[2], n[3], "in flight per domain <= cap")
	require.LessOrEqual(t, n[4], n[5], "per second per domain <= limit")
	t.Logf("chaos: scenario=15-scraper-example %s", last)
}
