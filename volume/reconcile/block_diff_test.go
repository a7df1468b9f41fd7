package reconcile

import (
	"errors"
	"reflect"
	"testing"
)

func TestDiffBlocksReturnsOnlyDifferingBlocks(t *testing.T) {
	tests := []struct {
		name         string
		source, dest []uint64
		want         []ExtentBlock
	}{
		{"empty extent", nil, nil, nil},
		{"identical", []uint64{1, 2, 3}, []uint64{1, 2, 3}, nil},
		{"first and last differ", []uint64{1, 2, 3, 4}, []uint64{9, 2, 3, 8}, []ExtentBlock{0, 3}},
		{"all differ", []uint64{1, 2}, []uint64{3, 4}, []ExtentBlock{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DiffBlocks(tt.source, tt.dest)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DiffBlocks = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestDiffBlocksRejectsDifferentLengths(t *testing.T) {
	if _, err := DiffBlocks([]uint64{1, 2}, []uint64{1}); !errors.Is(err, ErrBlockCountMismatch) {
		t.Fatalf("err = %v; want ErrBlockCountMismatch", err)
	}
}

func TestRunsGroupsConsecutiveBlocks(t *testing.T) {
	tests := []struct {
		in   []ExtentBlock
		want []BlockRun
	}{
		{nil, nil},
		{[]ExtentBlock{5}, []BlockRun{{5, 1}}},
		{[]ExtentBlock{0, 1, 2, 4, 5, 9}, []BlockRun{{0, 3}, {4, 2}, {9, 1}}},
		{[]ExtentBlock{3, 5, 7}, []BlockRun{{3, 1}, {5, 1}, {7, 1}}},
	}
	for _, tt := range tests {
		if got := Runs(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Runs(%v) = %v; want %v", tt.in, got, tt.want)
		}
	}
}
