package ui_test

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/testkit"
)

// TestEventsOfSeveralPages: one stream of several pages (what the tabs of a browser share)
// sends each page's live part, as its own stream would, in an event named for its place in the
// request, page after page for every poll; a request the stream cannot serve is refused.
func TestEventsOfSeveralPages(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	hold(t, b, "worker-1", "shared:1")
	base := serve(t, newHandler(t, b.Pool))

	for _, q := range []string{"page=leases&page=name", "page=leases&page=leases", "page=leases&page=nope"} {
		req, err := http.NewRequestWithContext(b.Ctx, http.MethodGet, base+"events?"+q, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
	}

	req, err := http.NewRequestWithContext(b.Ctx, http.MethodGet, base+"events?page=leases&page=name&n=shared:1&page=name&n=shared:2", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	// Each event of a poll, in order: its name and data; the events of two polls.
	type event struct{ name, data string }
	got := make(chan event, 16)
	go func() {
		defer close(got)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var e event
		for sc.Scan() {
			switch line := sc.Text(); {
			case strings.HasPrefix(line, "event: "):
				e.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				e.data += strings.TrimPrefix(line, "data: ") + "\n"
			case line == "" && e.name != "":
				got <- e
				e = event{}
			}
		}
	}()
	for poll := range 2 {
		var evs []event
		for len(evs) < 3 {
			select {
			case e, ok := <-got:
				require.True(t, ok, "the stream ended")
				evs = append(evs, e)
			case <-time.After(10 * time.Second):
				t.Fatalf("poll %d: %d events of 3 within 10s", poll, len(evs))
			}
		}
		require.Equal(t, []string{"update 0", "update 1", "update 2"}, []string{evs[0].name, evs[1].name, evs[2].name})
		require.Contains(t, evs[0].data, `<table id="leases">`)
		require.Contains(t, evs[1].data, `<td class="holder">worker-1</td>`)
		require.Contains(t, evs[2].data, `<p class="empty" id="holder">Not held.</p>`)
	}
}
