package liveview

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The pages of an event stream: one page as before (events "update"), or several, which the
// tabs of a browser share (events "update i"), each "name" page taking the next n in order.
func TestStreamPages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		query string
		want  []streamPage
	}{
		{"OnePage", "page=leases", []streamPage{{"leases", "", "update"}}},
		{"OneNamePage", "page=name&n=a%0Db", []streamPage{{"name", "a\rb", "update"}}},
		{"NameIgnoredOffTheNamePage", "page=leases&n=x", []streamPage{{"leases", "", "update"}}},
		{"SeveralPages", "page=leases&page=name&n=a&page=fences&page=name&n=b",
			[]streamPage{{"leases", "", "update 0"}, {"name", "a", "update 1"}, {"fences", "", "update 2"}, {"name", "b", "update 3"}}},
		{"NamesInOrderWhereverGiven", "n=a&n=b&page=name&page=leases&page=name",
			[]streamPage{{"name", "a", "update 0"}, {"leases", "", "update 1"}, {"name", "b", "update 2"}}},
		{"UnknownPageRefused", "page=leases&page=secrets", nil},
		{"NamePageWithoutNameRefused", "page=leases&page=name", nil},
		{"EmptyNameRefused", "page=name&n=", nil},
		{"PageTwiceRefused", "page=leases&page=leases", nil},
		{"NameTwiceRefused", "page=name&n=a&page=name&n=a", nil},
		{"NoPageRefused", "", nil},
		{"TooManyPagesRefused", names(maxStreamPages) + "page=leases", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, err := url.ParseQuery(tc.query)
			require.NoError(t, err)
			got, ok := streamPages(q)
			require.Equal(t, tc.want != nil, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

// names returns a query of n name pages, of names x0, x1, ..., each followed by "&".
func names(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "page=name&n=x%d&", i)
	}
	return b.String()
}
