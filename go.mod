module github.com/slowrank/slowrank

go 1.26
