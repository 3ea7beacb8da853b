package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestUIBehindPgBouncer: `fencelock ui` given a URL through PgBouncer in transaction mode
// shows what is held, and its forced release works there too.
func TestUIBehindPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bouncer, _ := viaPgBouncer(t, b, "transaction")
	lease, err := newLessor(t, b.Pool, "pooled-holder").TryAcquire(b.Ctx, "pooled:1", time.Minute)
	require.NoError(t, err)
	base := startUIAt(t, b, bouncer.URL(b.DB.Name))
	var page string
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "leases")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		page = string(body)
		return resp.StatusCode == http.StatusOK && !strings.Contains(page, "Waiting for the first answer")
	}, 20*time.Second, 50*time.Millisecond)
	require.NotContains(t, page, "last poll failed")
	require.Contains(t, page, "pooled-holder")
	require.Contains(t, page, fmt.Sprint(int64(lease.Token())))

	// A forced release through the same pooler: one transaction, as transaction pooling needs.
	csrf := regexp.MustCompile(`<meta name="fencelock-csrf" content="([0-9a-f]+)">`).FindStringSubmatch(page)
	require.NotNil(t, csrf)
	form := url.Values{"name": {"pooled:1"}, "holder": {"pooled-holder"}, "token": {fmt.Sprint(int64(lease.Token()))}}
	req, err := http.NewRequest(http.MethodPost, base+"release", strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Fencelock-CSRF", csrf[1])
	req.Header.Set("Authorization", "Bearer "+uiSecret)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, leaseRow{Holder: "fencelock force-release", Token: readLease(t, b.Ctx, b.Pool, "pooled:1").Token, Expired: true},
		readLease(t, b.Ctx, b.Pool, "pooled:1"))
	require.Greater(t, readLease(t, b.Ctx, b.Pool, "pooled:1").Token, int64(lease.Token()))
}
