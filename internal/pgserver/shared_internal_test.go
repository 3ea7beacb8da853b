package pgserver

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
)

// Under -short, Main skips the examples (which cannot skip themselves) by adding ^Example to
// -test.skip, keeping the user's own pattern; a pattern with a slash is left alone.
func TestSkipExamplesIfShort(t *testing.T) {
	short, skip := flag.Lookup("test.short").Value.String(), flag.Lookup("test.skip").Value.String()
	t.Cleanup(func() {
		require.NoError(t, flag.Set("test.short", short))
		require.NoError(t, flag.Set("test.skip", skip))
	})
	for _, tc := range []struct{ short, skip, want string }{
		{"true", "", "^Example"},
		{"true", "TestSlow", "TestSlow|^Example"},
		{"true", "TestA/sub", "TestA/sub"},
		{"false", "TestSlow", "TestSlow"},
	} {
		require.NoError(t, flag.Set("test.short", tc.short))
		require.NoError(t, flag.Set("test.skip", tc.skip))
		require.NoError(t, SkipExamplesIfShort())
		require.Equal(t, tc.want, flag.Lookup("test.skip").Value.String(), "short=%s skip=%q", tc.short, tc.skip)
	}
}
