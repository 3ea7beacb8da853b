package cli

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// versionCommand is "fencelock version", and "fencelock --version": the build's version (see
// [buildVersion]), one line, or one JSON object with --json. It needs no database.
func versionCommand(fs *flag.FlagSet) func(context.Context, *session, []string) error {
	return func(ctx context.Context, s *session, args []string) error {
		if len(args) > 0 {
			return withCode(ExitUsage, "version: unexpected argument %q", args[0])
		}
		return s.printVersion()
	}
}

// printVersion prints the running binary's version: as a line, or with --json as an object.
func (s *session) printVersion() error {
	v := buildVersion(debug.ReadBuildInfo())
	if s.json {
		return s.printJSON(v)
	}
	_, err := fmt.Fprintln(s.stdout, v)
	return err
}

// version is what a binary knows of its build.
type version struct {
	// Version is the fencelock module's version: the release's ("v0.1.0") for a binary
	// built by go install ...@v0.1.0, "(devel)" for one built from a source tree (a
	// pseudo-version when the go command derived one from the tree's VCS).
	Version string `json:"version"`
	// Revision, Time and Modified describe the VCS checkout a source build came from
	// (vcs.revision, vcs.time and vcs.modified of the build settings); empty when the go
	// command recorded none (a build of a module zip, or -buildvcs=false).
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// Go is the Go version the binary was built with ("go1.26.8"); Platform its GOOS/GOARCH.
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// buildVersion returns the version that bi describes, as debug.ReadBuildInfo returns it
// (ok false: a binary without build information, whose Version is "(devel)" too).
func buildVersion(bi *debug.BuildInfo, ok bool) version {
	v := version{Version: "(devel)", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok || bi == nil {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			v.Revision = kv.Value
		case "vcs.time":
			v.Time = kv.Value
		case "vcs.modified":
			v.Modified = kv.Value == "true"
		}
	}
	return v
}

// String returns v as "fencelock v0.1.0 (go1.26.8 linux/amd64)", with the revision after
// the version when there is one: "fencelock (devel), revision 00d5874a1b2c… of
// 2026-11-26T18:40:00Z, modified (go1.26.8 linux/amd64)".
func (v version) String() string {
	var b strings.Builder
	b.WriteString("fencelock " + v.Version)
	if v.Revision != "" {
		b.WriteString(", revision " + v.Revision)
		if v.Time != "" {
			b.WriteString(" of " + v.Time)
		}
		if v.Modified {
			b.WriteString(", modified")
		}
	}
	fmt.Fprintf(&b, " (%s %s)", v.Go, v.Platform)
	return b.String()
}
