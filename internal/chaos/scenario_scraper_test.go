package chaos

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// Scenario 15: examples/scraper, run as a user would: three worker processes over 10 accounts
// (a lease each) and 3 domains (a semaphore of 2 and a rate limit of 40/s each), one process
// paused (SIGSTOP) past the TTL a quarter in. The example checks from the database that no
// domain ever had more than 2 requests in flight or more than 40 allowed in a second, and that
// no account was used by two workers at once; it exits non-zero otherwise, and its last line
// counts them.
func TestScenarioScraperExample(t *testing.T) {
	t.Parallel()
	e := setup(t, setupOpts{scenario: "15-scraper-example"})
	out, last := runExample(t, e, "scraper", "FENCELOCK_SCRAPER_SECONDS=4")
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
