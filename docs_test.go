package locker_test

// Checks on the documentation and on the shape of the library's code:
// every test, benchmark, fuzz target and example the docs cite exists; the
// README's first program runs with no server; no library function is over
// 80 lines; no exported type is an alias of an internal package's type.

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// repoFiles returns the repository's files whose base name satisfies keep,
// relative to the repository root (this package's directory), skipping
// hidden directories and testdata.
func repoFiles(t *testing.T, keep func(path string) bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if keep(path) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// docFiles are the files whose citations are checked: README.md, every
// markdown file under docs/, and every doc.go.
func docFiles(t *testing.T) []string {
	return repoFiles(t, func(p string) bool {
		return p == "README.md" ||
			(strings.HasPrefix(p, "docs"+string(filepath.Separator)) && strings.HasSuffix(p, ".md")) ||
			filepath.Base(p) == "doc.go"
	})
}

// testFuncs is every top-level func declared in a _test.go file of the
// repository (the main module and bench/'s), by name, and every string
// literal in its Go files (the subtests' names, some of which are run by
// helpers outside _test.go files).
func testFuncs(t *testing.T) (funcs map[string]bool, literals []string) {
	t.Helper()
	funcs = map[string]bool{}
	fset := token.NewFileSet()
	for _, path := range repoFiles(t, func(p string) bool { return strings.HasSuffix(p, ".go") }) {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasSuffix(path, "_test.go") {
				funcs[fd.Name.Name] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					literals = append(literals, s)
				}
			}
			return true
		})
	}
	return funcs, literals
}

// citation matches a cited test, benchmark, fuzz target or example, with an
// optional subtest path (TestFair/head-takes-over), or followed by a * or
// a ( that makes it a prefix (TestSessionFault*, -run 'TestHold(A|B)$').
var citation = regexp.MustCompile(`\b((?:Test|Benchmark|Fuzz|Example)[A-Z_][A-Za-z0-9_]*)([*(]?)((?:/[A-Za-z0-9_.<>*-]+)*)`)

// TestDocCitations fails when README.md, a docs/*.md file or a doc.go cites
// a test, benchmark, fuzz target or example that does not exist, or a
// subtest whose name appears in no test file.
func TestDocCitations(t *testing.T) {
	funcs, literals := testFuncs(t)
	if len(funcs) < 100 {
		t.Fatalf("found only %d test funcs: is the walk rooted at the repository?", len(funcs))
	}
	cited := 0
	for _, path := range docFiles(t) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range citation.FindAllStringSubmatch(line, -1) {
				name, star, sub := m[1], m[2], m[3]
				cited++
				if !funcExists(funcs, name, star != "") {
					t.Errorf("%s:%d: %s%s is not a func in any _test.go file", path, i+1, name, star)
					continue
				}
				for _, part := range strings.Split(strings.Trim(sub, "/"), "/") {
					if part != "" && !strings.ContainsAny(part, "<>*") && !subtestNamed(literals, part) {
						t.Errorf("%s:%d: subtest %q of %s appears in no test file", path, i+1, part, name)
					}
				}
			}
		}
	}
	t.Logf("%d citations checked against %d test funcs", cited, len(funcs))
}

func funcExists(funcs map[string]bool, name string, prefix bool) bool {
	if !prefix {
		return funcs[name]
	}
	for f := range funcs {
		if strings.HasPrefix(f, name) {
			return true
		}
	}
	return false
}

// subtestNamed reports whether some string literal of a Go file is the
// subtest name part, or a path that contains it ("x/" + y), or the stem of a
// generated name (part "barging-32" or "fair-", literal "barging").
func subtestNamed(literals []string, part string) bool {
	for _, s := range literals {
		if s == part || strings.HasSuffix(s, "/"+part) || strings.HasPrefix(s, part+"/") ||
			strings.Contains(s, "/"+part+"/") || (len(s) >= 3 && strings.HasPrefix(part, s+"-")) {
			return true
		}
	}
	return false
}

// readmeProgram returns the README's first ```go block.
func readmeProgram(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\n```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	src, _, ok := strings.Cut(rest, "\n```")
	if !ok {
		t.Fatal("README.md's first ```go block is not closed")
	}
	return src + "\n"
}

// TestReadmeProgramRuns copies the README's first Go block into a module of
// its own that requires this one (replaced by the checkout) and runs it
// with go run, offline, with no server: a newcomer's paste must work.
func TestReadmeProgramRuns(t *testing.T) {
	src := readmeProgram(t)
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("the README's first Go block does not parse as a file: %v", err)
	}
	if f.Name.Name != "main" {
		t.Fatalf("the README's first Go block is package %s, want main", f.Name.Name)
	}
	if !slices.ContainsFunc(f.Decls, func(d ast.Decl) bool {
		fd, ok := d.(*ast.FuncDecl)
		return ok && fd.Recv == nil && fd.Name.Name == "main"
	}) {
		t.Fatal("the README's first Go block has no func main")
	}

	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// The newcomer's module requires what the checkout's does, at the same
	// versions, so its module graph is the checkout's: every go.mod it
	// needs is in the cache the checkout's own build filled.
	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	_, reqs, ok := strings.Cut(string(rootMod), "\n")
	if !ok || !strings.HasPrefix(string(rootMod), "module github.com/go-locker/locker") {
		t.Fatalf("go.mod does not start with the module line:\n%s", rootMod)
	}
	gomod := "module readme.example/newcomer\n" + reqs +
		"\nrequire github.com/go-locker/locker v0.0.0\n\n" +
		"replace github.com/go-locker/locker => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		gobin = "go"
	}
	ctx := t.Context()
	if d, ok := t.Deadline(); ok {
		var cancel func()
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, gobin, "run", ".")
	cmd.Dir = dir
	// Offline: every module comes from the cache the checkout already uses.
	// No LOCKER_* variable reaches the program, so it cannot find a server.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOPROXY=") ||
			strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "LOCKER_")
	})
	cmd.Env = append(env, "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run of the README's first program: %v\n%s", err, out.String())
	}
	if out.Len() == 0 {
		t.Fatal("the README's first program printed nothing")
	}
	t.Logf("output:\n%s", out.String())
}

// libraryFiles are the Go files of the library a program links: everything
// but _test.go files, the bench/ module and the packages that exist only for
// tests (conformance and its faultproxy, which a driver's tests import, and
// internal/*test, which start servers for the tests).
func libraryFiles(t *testing.T) []string {
	return repoFiles(t, func(p string) bool {
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return false
		}
		parts := strings.Split(filepath.ToSlash(p), "/")
		if parts[0] == "bench" || parts[0] == "conformance" {
			return false
		}
		for _, dir := range parts[:len(parts)-1] {
			if strings.HasSuffix(dir, "test") {
				return false
			}
		}
		return true
	})
}

// maxFuncLines is the longest a library function may be, from its func
// line to its closing brace.
const maxFuncLines = 80

// TestNoLongFunctions fails on every library function (a func or method
// declared outside _test.go files and bench/) over maxFuncLines lines.
func TestNoLongFunctions(t *testing.T) {
	fset := token.NewFileSet()
	for _, path := range libraryFiles(t) {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			if n := end.Line - start.Line + 1; n > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines (at most %d)", path, start.Line, funcName(fd), n, maxFuncLines)
			}
		}
	}
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
}

// TestNoExportedAliasOfInternal fails, outside internal packages, on every
// exported type alias whose type comes from an internal package, and on
// every exported struct that embeds an internal type (directly or through
// an alias): go doc shows neither the alias's fields nor the embedded
// type's methods.
func TestNoExportedAliasOfInternal(t *testing.T) {
	fset := token.NewFileSet()
	for _, path := range libraryFiles(t) {
		if slices.Contains(strings.Split(filepath.ToSlash(filepath.Dir(path)), "/"), "internal") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		internal := map[string]string{} // local package name -> import path
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !slices.Contains(strings.Split(p, "/"), "internal") {
				continue
			}
			name := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			internal[name] = p
		}
		// internalRef names the internal type expr refers to, or "".
		internalRef := func(expr ast.Expr) string {
			ref := ""
			ast.Inspect(expr, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" && ref == "" {
						ref = id.Name + "." + sel.Sel.Name + " (package " + internal[id.Name] + ")"
					}
					return false
				}
				return true
			})
			return ref
		}
		aliases := map[string]string{} // alias of an internal type -> what it names
		var structs []*ast.TypeSpec
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if ref := internalRef(ts.Type); ts.Assign.IsValid() && ref != "" {
					aliases[ts.Name.Name] = ref
					if ts.Name.IsExported() {
						t.Errorf("%s:%d: exported alias %s = %s", path, fset.Position(ts.Pos()).Line, ts.Name.Name, ref)
					}
				}
				if _, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() {
					structs = append(structs, ts)
				}
			}
		}
		for _, ts := range structs {
			for _, field := range ts.Type.(*ast.StructType).Fields.List {
				if len(field.Names) > 0 {
					continue
				}
				typ := field.Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				ref := internalRef(typ)
				if id, ok := typ.(*ast.Ident); ok {
					ref = aliases[id.Name]
				}
				if ref != "" {
					t.Errorf("%s:%d: exported %s embeds %s: go doc lists none of its methods",
						path, fset.Position(field.Pos()).Line, ts.Name.Name, ref)
				}
			}
		}
	}
}

// TestDriverExampleInSync fails when docs/writing-a-driver.md's example
// driver and its test differ from docs/tablelock, where they compile and
// run the conformance suite.
func TestDriverExampleInSync(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("docs", "writing-a-driver.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"driver.go", "driver_test.go"} {
		src, err := os.ReadFile(filepath.Join("docs", "tablelock", name))
		if err != nil {
			t.Fatal(err)
		}
		block := "```go\n" + strings.TrimRight(string(src), "\n") + "\n```\n"
		if !strings.Contains(string(page), block) {
			t.Errorf("docs/writing-a-driver.md does not show docs/tablelock/%s as it is", name)
		}
	}
}

// mdLink matches a markdown link's target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinks fails on a relative link in README.md or docs/ to a file that
// does not exist, or to a heading that the file does not have (GitHub's
// anchors: lower case, punctuation dropped, spaces as hyphens).
func TestDocLinks(t *testing.T) {
	pages := repoFiles(t, func(p string) bool {
		return p == "README.md" || (strings.HasPrefix(p, "docs"+string(filepath.Separator)) && strings.HasSuffix(p, ".md"))
	})
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				path := page
				if file != "" {
					path = filepath.Join(filepath.Dir(page), file)
				}
				st, err := os.Stat(path)
				if err != nil {
					t.Errorf("%s:%d: link %s: %v", page, i+1, target, err)
					continue
				}
				if anchor != "" && !st.IsDir() && !slices.Contains(anchors(t, path), anchor) {
					t.Errorf("%s:%d: link %s: no heading #%s in %s", page, i+1, target, anchor, path)
				}
			}
		}
	}
}

// anchors returns the GitHub anchors of a markdown file's headings.
func anchors(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r > 127:
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
