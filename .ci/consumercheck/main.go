// Command consumercheck serves modules of this repository at one version, built from the
// working tree, from a file-system module proxy, so that a module outside the repository can
// go get them as it will get a release (see ../consumer-check, which runs it):
//
//	go run . -repo ../.. -version v0.1.0 -proxy /tmp/x/proxy . pgtest
//
// writes, for each module directory named (relative to -repo), the files a proxy serves
// under the module's case-encoded path: @v/list, @v/VERSION.info, @v/VERSION.mod and
// @v/VERSION.zip; GOPROXY=file:///tmp/x/proxy then serves them.
//
// A zip holds what golang.org/x/mod/zip.CreateFromDir would put in it (no nested module, no
// VCS directory, no symbolic link), less what a release could not hold: a worktree's .git
// file and the files git ignores (test binaries, profiles). Each zip is checked with
// zip.CheckZip and must hold go.mod and LICENSE.
//
// Before it builds anything it checks the licence: every module directory of the repository
// (each directory with a go.mod, directories starting with "." or "_" and testdata left out,
// as the go command leaves them out) has a LICENSE identical to the root's, because a module
// zip holds only its own directory. It exits 1 on the first failure.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root `directory`")
	version := flag.String("version", "v0.1.0", "the `version` the modules are served at")
	proxy := flag.String("proxy", "", "the proxy's `directory` (created; required)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: consumercheck -proxy DIR [-repo DIR] [-version v0.1.0] MODULE_DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *proxy == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*repo, *version, *proxy, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "consumercheck:", err)
		os.Exit(1)
	}
}

func run(repo, version, proxy string, dirs []string) error {
	if err := checkLicenses(repo); err != nil {
		return err
	}
	for _, dir := range dirs {
		if err := serve(filepath.Join(repo, dir), version, proxy); err != nil {
			return err
		}
	}
	return nil
}

// checkLicenses fails unless every module directory under repo has a LICENSE with the bytes
// of repo's own.
func checkLicenses(repo string) error {
	want, err := os.ReadFile(filepath.Join(repo, "LICENSE"))
	if err != nil {
		return fmt.Errorf("licence: %w", err)
	}
	var modules, bad []string
	err = filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != repo && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err != nil {
			return nil
		}
		rel, err := filepath.Rel(repo, path)
		if err != nil {
			return err
		}
		modules = append(modules, rel)
		got, err := os.ReadFile(filepath.Join(path, "LICENSE"))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			bad = append(bad, rel+"/LICENSE is missing")
		case err != nil:
			return err
		case !bytes.Equal(got, want):
			bad = append(bad, rel+"/LICENSE differs from the root's")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("licence: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("licence: %s (a module zip holds only its own directory: copy the root's LICENSE there)", strings.Join(bad, "; "))
	}
	fmt.Printf("LICENSE: the root's, in each of %d module directories (%s)\n", len(modules), strings.Join(modules, ", "))
	return nil
}

// serve writes the module in dir at version into the proxy directory.
func serve(dir, version, proxy string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return fmt.Errorf("%s/go.mod: no module path", dir)
	}
	m := module.Version{Path: path, Version: version}
	files, err := moduleFiles(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", m, err)
	}
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	zipPath := filepath.Join(vdir, escVersion+".zip")
	zf, err := os.Create(zipPath)
	if err != nil {
		return err
	}
	if err := zip.Create(zf, m, files); err != nil {
		zf.Close()
		return err
	}
	if err := zf.Close(); err != nil {
		return err
	}
	cf, err := zip.CheckZip(m, zipPath)
	if err != nil {
		return err
	}
	for _, need := range []string{"go.mod", "LICENSE"} {
		if !slices.Contains(cf.Valid, m.String()+"/"+need) {
			return fmt.Errorf("%s: the zip holds no %s", m, need)
		}
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"list":               []byte(version + "\n"),
		escVersion + ".info": info,
		escVersion + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	st, err := os.Stat(zipPath)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %d files, %d KiB zip, served from %s\n", m, len(cf.Valid), st.Size()/1024, vdir)
	return nil
}

// moduleFiles lists the files of dir that belong in its module zip, as
// zip.CreateFromDir lists them (zip.Create leaves out nested modules and irregular files),
// less any entry named as a VCS's metadata (a worktree's .git is a file) and the untracked
// files git ignores.
func moduleFiles(dir string) ([]zip.File, error) {
	ignored, err := gitIgnored(dir)
	if err != nil {
		return nil, err
	}
	var files []zip.File
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch d.Name() {
		case ".bzr", ".git", ".hg", ".svn":
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if ignored[rel] {
			return nil
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		files = append(files, dirFile{path: path, rel: rel, info: info})
		return nil
	})
	return files, err
}

// gitIgnored returns the untracked files under dir that git ignores, by their slash path
// relative to dir; none when dir is not in a git work tree.
func gitIgnored(dir string) (map[string]bool, error) {
	if err := exec.Command("git", "-C", dir, "rev-parse", "--is-inside-work-tree").Run(); err != nil {
		return nil, nil
	}
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--others", "--ignored", "--exclude-standard").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	ignored := map[string]bool{}
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			ignored[p] = true
		}
	}
	return ignored, nil
}

// dirFile is a file of the working tree, as zip.Create takes it.
type dirFile struct {
	path, rel string
	info      fs.FileInfo
}

func (f dirFile) Path() string                 { return f.rel }
func (f dirFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f dirFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }
