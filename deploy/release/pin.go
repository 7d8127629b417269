package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// The digest lives in two forms: the chart's image.digest value, and
// image: lines of the plain manifests that name the repository.
var (
	valuesDigest  = regexp.MustCompile(`(?m)^(  digest: )"[^"\n]*"`)
	valuesImage   = regexp.MustCompile(`(?m)^image:\n(?:  .*\n|[ \t]*#.*\n)*`)
	digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// manifestImage matches the (uncommented) image: lines naming repo, with
// any tag and digest.
func manifestImage(repo string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^(\s+(?:- )?image: )` + regexp.QuoteMeta(repo) + `(?::[\w.-]+)?(?:@sha256:[0-9a-f]{64})?\s*$`)
}

// pinValues returns values.yaml with image.digest set to digest. Only the
// digest line of the top-level image block changes.
func pinValues(values []byte, digest string) ([]byte, error) {
	loc := valuesImage.FindIndex(values)
	if loc == nil {
		return nil, fmt.Errorf("values: no top-level image: block")
	}
	block := values[loc[0]:loc[1]]
	if n := len(valuesDigest.FindAllIndex(block, -1)); n != 1 {
		return nil, fmt.Errorf("values: image: block has %d digest: lines, want 1", n)
	}
	fixed := valuesDigest.ReplaceAll(block, []byte(`${1}"`+digest+`"`))
	return bytes.Join([][]byte{values[:loc[0]], fixed, values[loc[1]:]}, nil), nil
}

// pinnedDigest returns the digest the values file pins ("" for none).
func pinnedDigest(values []byte) (string, error) {
	block := valuesImage.Find(values)
	if block == nil {
		return "", fmt.Errorf("values: no top-level image: block")
	}
	m := regexp.MustCompile(`(?m)^  digest: "([^"\n]*)"`).FindAllSubmatch(block, -1)
	if len(m) != 1 {
		return "", fmt.Errorf("values: image: block has %d digest: lines, want 1", len(m))
	}
	return string(m[0][1]), nil
}

// pinManifest returns a manifest with every image: line of repo set to
// repo:tag@digest, and how many lines name it.
func pinManifest(m []byte, repo, tag, digest string) ([]byte, int) {
	re := manifestImage(repo)
	n := len(re.FindAllIndex(m, -1))
	return re.ReplaceAll(m, []byte("${1}"+repo+":"+tag+"@"+digest)), n
}

// pin writes digest into the values file and the manifests, or with check
// only reports (as an error) the files that do not already say it. Each
// manifest that names repo at all must name it on image: lines only.
func pin(digest, repo, tag, valuesFile string, manifests []string, check bool) error {
	if !digestPattern.MatchString(digest) {
		return fmt.Errorf("digest %q is not sha256:<64 hex>", digest)
	}
	var stale []string
	update := func(path string, fix func([]byte) ([]byte, error)) error {
		old, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		got, err := fix(old)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if bytes.Equal(old, got) {
			return nil
		}
		stale = append(stale, path)
		if check {
			return nil
		}
		return os.WriteFile(path, got, 0o644)
	}
	if err := update(valuesFile, func(b []byte) ([]byte, error) { return pinValues(b, digest) }); err != nil {
		return err
	}
	for _, m := range manifests {
		err := update(m, func(b []byte) ([]byte, error) {
			got, n := pinManifest(b, repo, tag, digest)
			if all := countUncommented(b, repo); all != n {
				return nil, fmt.Errorf("names %s on %d lines, %d of them image: lines", repo, all, n)
			}
			return got, nil
		})
		if err != nil {
			return err
		}
	}
	if check && len(stale) > 0 {
		return fmt.Errorf("%s do not pin %s:%s@%s: make release-pin", strings.Join(stale, ", "), repo, tag, digest)
	}
	return nil
}

// countUncommented counts the lines outside YAML comments that name repo.
func countUncommented(b []byte, repo string) int {
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, "#"); i >= 0 {
			l = l[:i]
		}
		if strings.Contains(l, repo) {
			n++
		}
	}
	return n
}
