package cli

import (
	"context"
	"encoding/json"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuildVersion(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		// go install github.com/fencelock/fencelock/cmd/fencelock@v0.1.0: no VCS settings.
		{"Release", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fencelock/fencelock", Version: "v0.1.0"}},
			true, "fencelock v0.1.0 (go1.26.8 " + platform + ")"},
		{"SourceTree", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/fencelock/fencelock", Version: "(devel)"},
			Settings: []debug.BuildSetting{
				{Key: "-buildmode", Value: "exe"},
				{Key: "vcs", Value: "git"},
				{Key: "vcs.revision", Value: "00d5874a1b2c3d4e5f60718293a4b5c6d7e8f901"},
				{Key: "vcs.time", Value: "2026-11-26T18:40:00Z"},
				{Key: "vcs.modified", Value: "false"},
			}},
			true, "fencelock (devel), revision 00d5874a1b2c3d4e5f60718293a4b5c6d7e8f901 of 2026-11-26T18:40:00Z (go1.26.8 " + platform + ")"},
		{"SourceTreeModified", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261126184000-00d5874a1b2c+dirty"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "00d5874a1b2c3d4e5f60718293a4b5c6d7e8f901"},
				{Key: "vcs.time", Value: "2026-11-26T18:40:00Z"},
				{Key: "vcs.modified", Value: "true"},
			}},
			true, "fencelock v0.0.0-20261126184000-00d5874a1b2c+dirty, revision 00d5874a1b2c3d4e5f60718293a4b5c6d7e8f901 of 2026-11-26T18:40:00Z, modified (go1.26.8 " + platform + ")"},
		// -buildvcs=false, or no VCS: the version alone.
		{"SourceTreeNoVCS", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			true, "fencelock (devel) (go1.26.8 " + platform + ")"},
		{"NoBuildInfo", nil, false, "fencelock (devel) (" + runtime.Version() + " " + platform + ")"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, buildVersion(tc.bi, tc.ok).String())
		})
	}
}

// version and --version print the same line, with or without a database URL; --json an
// object; both exit 0 and need no database.
func TestRunVersion(t *testing.T) {
	env := func(string) string { return "postgres://nowhere.invalid/db" }
	var want string
	for _, args := range [][]string{{"version"}, {"--version"}, {"--database-url", "postgres://x.invalid/db", "version"}} {
		var stdout, stderr strings.Builder
		require.Equal(t, ExitOK, Run(context.Background(), args, env, nil, &stdout, &stderr), "%v", args)
		require.Empty(t, stderr.String(), "%v", args)
		out := stdout.String()
		require.True(t, strings.HasPrefix(out, "fencelock "), "%v: %q", args, out)
		require.True(t, strings.HasSuffix(out, " "+runtime.GOOS+"/"+runtime.GOARCH+")\n"), "%v: %q", args, out)
		require.Contains(t, out, "("+runtime.Version()+" ", "%v", args)
		if want == "" {
			want = out
		}
		require.Equal(t, want, out, "%v", args)
	}

	for _, args := range [][]string{{"version", "--json"}, {"--json", "version"}, {"--json", "--version"}} {
		var stdout, stderr strings.Builder
		require.Equal(t, ExitOK, Run(context.Background(), args, env, nil, &stdout, &stderr), "%v", args)
		require.Empty(t, stderr.String(), "%v", args)
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(stdout.String()), &got), "%v: %q", args, stdout.String())
		require.NotEmpty(t, got["version"], "%v", args)
		require.Equal(t, runtime.Version(), got["go"], "%v", args)
		require.Equal(t, runtime.GOOS+"/"+runtime.GOARCH, got["platform"], "%v", args)
	}

	var stdout, stderr strings.Builder
	require.Equal(t, ExitUsage, Run(context.Background(), []string{"version", "x"}, env, nil, &stdout, &stderr))
	require.Equal(t, "fencelock: version: unexpected argument \"x\"\n", stderr.String())
}

// The usage lists the command and the flag.
func TestUsageListsVersion(t *testing.T) {
	var stdout strings.Builder
	require.Equal(t, ExitOK, Run(context.Background(), []string{"help"}, nil, nil, &stdout, nil))
	require.Contains(t, stdout.String(), "\n  version  print the version of fencelock")
	require.Contains(t, stdout.String(), "\n  fencelock --version ")
	stdout.Reset()
	require.Equal(t, ExitOK, Run(context.Background(), []string{"help", "version"}, nil, nil, &stdout, nil))
	require.True(t, strings.HasPrefix(stdout.String(), "Usage:\n  fencelock version"), "%q", stdout.String())
	require.Contains(t, stdout.String(), "\n\nPrint the version of fencelock, the revision it was built from and the Go version.\n")
}
