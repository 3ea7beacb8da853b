package migrations_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
)

// The head schema: sqlc/schema.sql is the SQL of schema fencelock as the last migration leaves
// it, dumped from a database that fencelock.Migrate built. sqlc reads it, and readers find
// there the SQL that runs today without replaying the migrations in their heads.

const (
	// headSchemaFile is the head schema's path from the root of module
	// github.com/fencelock/fencelock.
	headSchemaFile = "sqlc/schema.sql"
	// updateSchemaEnv, set to 1, makes TestHeadSchemaIsCurrent rewrite headSchemaFile.
	updateSchemaEnv = "FENCELOCK_UPDATE_SCHEMA"
	// regenerateSchema is the command that rewrites headSchemaFile, run from anywhere in the
	// workspace.
	regenerateSchema = updateSchemaEnv + "=1 go test -count=1 -run TestHeadSchemaIsCurrent github.com/fencelock/fencelock/migrations/"
)

// headSchemaHeader opens headSchemaFile.
const headSchemaHeader = `-- GENERATED, DO NOT EDIT. fencelock's schema at the head: every table, index, view, sequence,
-- function and trigger of schema fencelock as the last migration of migrations/ leaves it.
-- The migrations are the history (and what fencelock.Migrate applies); this file is the SQL
-- that runs today. sqlc reads it (sqlc/sqlc.yaml). To change the schema, add a migration,
-- then regenerate this file:
--
--   ` + regenerateSchema + `
--
-- That applies the migrations with fencelock.Migrate to a fresh database of the test server,
-- runs pg_dump --schema-only --schema=fencelock --exclude-table=fencelock.goose_db_version
-- --no-owner --no-privileges (the pg_dump of the server's binaries) and drops what varies
-- between runs and pg_dump versions (version comments, SET and set_config lines, \restrict
-- keys, runs of blank lines). TestHeadSchemaIsCurrent (in CI) fails when this file differs.
`

// pgDumpArgs are pg_dump's arguments, before --dbname.
var pgDumpArgs = []string{
	"--schema-only",
	"--schema=fencelock",
	"--exclude-table=fencelock.goose_db_version",
	"--no-owner",
	"--no-privileges",
}

// The head schema in sqlc/schema.sql is what the migrations give: the test applies them to a
// fresh database, dumps schema fencelock and compares. With FENCELOCK_UPDATE_SCHEMA=1 it
// rewrites the file instead.
func TestHeadSchemaIsCurrent(t *testing.T) {
	t.Parallel()
	path := filepath.Join(moduleRoot(t), filepath.FromSlash(headSchemaFile))
	db := pgserver.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The database is a clone of a migrated template: start from nothing, as a fresh database.
	_, err := db.Pool.Exec(ctx, `DROP SCHEMA fencelock CASCADE`)
	require.NoError(t, err)
	require.NoError(t, fencelock.Migrate(ctx, db.Pool))

	var serverVersion string
	require.NoError(t, db.Pool.QueryRow(ctx, `SHOW server_version`).Scan(&serverVersion))
	pgDump, dumpVersion := findPgDump(t, ctx, serverVersion)
	cmd := exec.CommandContext(ctx, pgDump, append(pgDumpArgs, "--dbname="+db.URL)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "pg_dump: %s", stderr.String())
	got := headSchemaHeader + "\n" + normaliseSchemaDump(string(out))

	if os.Getenv(updateSchemaEnv) == "1" {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		t.Logf("wrote %s (server %s, %s)", path, serverVersion, dumpVersion)
		return
	}
	want, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is missing; create it with:\n\t%s", path, regenerateSchema)
	}
	require.NoError(t, err)
	if string(want) != got {
		t.Fatalf("%s differs from what the migrations give (server %s, %s):\n%s\nregenerate it with:\n\t%s",
			path, serverVersion, dumpVersion, firstDiff(string(want), got, 3, 40), regenerateSchema)
	}
}

// moduleRoot returns the directory of module github.com/fencelock/fencelock: the nearest
// directory, from the working directory up, whose go.mod declares it (go test runs in the
// package's directory, migrations, one level below).
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(mod) == "github.com/fencelock/fencelock" {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of module github.com/fencelock/fencelock above the working directory")
		}
		dir = parent
	}
}

// modulePath returns the module path that the go.mod text mod declares, or "".
func modulePath(mod []byte) string {
	s := bufio.NewScanner(bytes.NewReader(mod))
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// versionMajor matches the major version in "15.18 (Debian ...)" and "pg_dump (PostgreSQL) 15.18".
var versionMajor = regexp.MustCompile(`(?:^|\s)(\d+)(?:\.\d+|devel|beta|rc)`)

// major returns the major version in a server_version or pg_dump --version text, or 0.
func major(version string) int {
	m := versionMajor.FindStringSubmatch(version)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// findPgDump returns the path and version of a pg_dump at least as new as the server
// (serverVersion is its server_version): the one next to the server binaries pgserver runs
// (pgserver.EnvPGBin, else initdb on PATH, its symlinks resolved), else in the binaries of the
// server's major version (/usr/lib/postgresql/<major>/bin, /usr/pgsql-<major>/bin), else on
// PATH. Without one it skips the test, or fails it under CI.
func findPgDump(t *testing.T, ctx context.Context, serverVersion string) (path, version string) {
	t.Helper()
	want := major(serverVersion)
	var dirs []string
	if dir := os.Getenv(pgserver.EnvPGBin); dir != "" {
		dirs = append(dirs, dir)
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			dirs = append(dirs, filepath.Dir(real))
		}
		dirs = append(dirs, filepath.Dir(initdb))
	}
	dirs = append(dirs, fmt.Sprintf("/usr/lib/postgresql/%d/bin", want), fmt.Sprintf("/usr/pgsql-%d/bin", want))
	var candidates []string
	for _, dir := range dirs {
		candidates = append(candidates, filepath.Join(dir, "pg_dump"))
	}
	if p, err := exec.LookPath("pg_dump"); err == nil {
		candidates = append(candidates, p)
	}
	var tried []string
	for _, p := range candidates {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			continue
		}
		out, err := exec.CommandContext(ctx, p, "--version").Output()
		v := strings.TrimSpace(string(out))
		if err == nil && major(v) >= want {
			return p, v
		}
		tried = append(tried, fmt.Sprintf("%s (%s, %v)", p, v, err))
	}
	msg := fmt.Sprintf("no pg_dump of PostgreSQL %d or later (tried %v); install the PostgreSQL client or set %s", want, tried, pgserver.EnvPGBin)
	if inCI() {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipped; with CI=true this fails)")
	return "", ""
}

// inCI reports whether the environment variable CI is set to a true value ("true", "1" or
// "yes", in any case), as CI services and fencelock's .ci/run set it.
// (A copy of pgtest.InCI: the library's module cannot require pgtest's.)
func inCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "true", "1", "yes":
		return true
	}
	return false
}

// normaliseSchemaDump returns pg_dump's output without what varies between runs and pg_dump
// minor versions: the "Dumped from/by" comments, SET and set_config lines, \restrict and
// \unrestrict lines (random keys, since the minor releases of August 2025), and with every run of
// blank lines collapsed to one, no blank lines at either end, and a final newline.
func normaliseSchemaDump(dump string) string {
	var out []string
	blank := false
	for line := range strings.SplitSeq(strings.ReplaceAll(dump, "\r\n", "\n"), "\n") {
		line = strings.TrimRight(line, " \t")
		switch {
		case strings.HasPrefix(line, "-- Dumped from "), strings.HasPrefix(line, "-- Dumped by "),
			strings.HasPrefix(line, "SET "), strings.HasPrefix(line, "SELECT pg_catalog.set_config("),
			strings.HasPrefix(line, `\restrict`), strings.HasPrefix(line, `\unrestrict`):
			continue
		case line == "":
			blank = len(out) > 0
			continue
		}
		if blank {
			out = append(out, "")
			blank = false
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n") + "\n"
}

// firstDiff shows where want and got first differ: the lines they share at each end trimmed,
// the rest as "-" (want) and "+" (got) lines, after up to context shared lines, at most limit
// lines of each side, with line numbers in the manner of a unified diff's hunk header.
func firstDiff(want, got string, context, limit int) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	start := 0
	for start < len(w) && start < len(g) && w[start] == g[start] {
		start++
	}
	endW, endG := len(w), len(g)
	for endW > start && endG > start && w[endW-1] == g[endG-1] {
		endW--
		endG--
	}
	from := max(start-context, 0)
	var sb strings.Builder
	fmt.Fprintf(&sb, "@@ -%d,%d +%d,%d @@ (- %s, + the migrations)\n", from+1, endW-from, from+1, endG-from, headSchemaFile)
	for _, l := range w[from:start] {
		sb.WriteString("  " + l + "\n")
	}
	side := func(sign string, lines []string) {
		for i, l := range lines {
			if i == limit {
				fmt.Fprintf(&sb, "%s ... %d more lines\n", sign, len(lines)-limit)
				return
			}
			sb.WriteString(sign + " " + l + "\n")
		}
	}
	side("-", w[start:endW])
	side("+", g[start:endG])
	return sb.String()
}

// The normalisation drops what varies between runs and versions and nothing else; the diff
// shows the first differing lines after their context.
func TestHeadSchemaNormalise(t *testing.T) {
	t.Parallel()
	dump := "--\n-- PostgreSQL database dump\n--\n\n\\restrict AbC123\n\n-- Dumped from database version 15.18\n" +
		"-- Dumped by pg_dump version 15.18\n\nSET statement_timeout = 0;\n" +
		"SELECT pg_catalog.set_config('search_path', '', false);\n\n\n\n" +
		"CREATE TABLE fencelock.t (\n    a integer  \n);\r\n\n\n\\unrestrict AbC123\n\n"
	require.Equal(t, "--\n-- PostgreSQL database dump\n--\n\nCREATE TABLE fencelock.t (\n    a integer\n);\n", normaliseSchemaDump(dump))

	want := "a\nb\nc\nd\ne\nf\n"
	got := "a\nb\nc\nD\ne\nf\n"
	require.Equal(t, "@@ -2,3 +2,3 @@ (- sqlc/schema.sql, + the migrations)\n  b\n  c\n- d\n+ D\n", firstDiff(want, got, 2, 40))
	require.Equal(t, "@@ -1,4 +1,2 @@ (- sqlc/schema.sql, + the migrations)\n  a\n- b\n- c\n- ... 1 more lines\n+ x\n", firstDiff("a\nb\nc\nd\n", "a\nx\n", 1, 2))

	for version, want := range map[string]int{
		"15.18 (Debian 15.18-0+deb12u1)":                      15,
		"pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)": 15,
		"pg_dump (PostgreSQL) 18beta1":                        18,
		"9.6.24":                                              9,
		"no version":                                          0,
	} {
		require.Equal(t, want, major(version), version)
	}
	require.Equal(t, "github.com/fencelock/fencelock", modulePath([]byte("// c\nmodule github.com/fencelock/fencelock\n\ngo 1.26.0\n")))
	require.Empty(t, modulePath([]byte("go 1.26.0\n")))
}
