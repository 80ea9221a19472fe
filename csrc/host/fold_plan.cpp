// gradsweep._fold_plan: the host planning of one CanonicalFold.take_tiles call, compiled (issue 13).
//
// Why: a call's plan is a small integer state machine (register the call's runs into the received slot
// intervals, advance the cursor over complete tiles, cut the runs into per-tile pieces, give the staged pieces
// staging blocks, release the ready tiles, describe them). In numpy it is ~85 array operations on arrays of
// ~10-200 elements, each paying numpy's per-call cost: ~100 us of host per cold chunked call on the CPU box,
// ~200 us on the lent H200 hosts, against issue 13's 50 us. Here the same steps run in one pass.
//
// What it must equal: gradsweep/canonical.py's numpy path (`CanonicalFold._plan_tiles_numpy`), value for value
// and in the same order (the staging copy's index and the descriptors are uploaded as they are, and the
// golden-upload test pins them): tests/test_fold_plan_native.py runs both on random call sequences. This file
// plans only; allocation, copies and uploads stay with the caller (torch).
//
// Built by the host compiler alone (no CUDA, no torch): setup.py builds it on every machine that has a C++
// compiler and pybind11; without it canonical.py runs the numpy path (the same plans).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

const int64_t* data(const I64& a) { return a.data(); }

I64 vec_array(const std::vector<int64_t>& v) {
  I64 out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

struct Piece {
  int64_t tile, lo, row, len;
};

// One call's planning state: what CanonicalFold._register / _advance / _pieces / _stage_pieces / _release do, in
// the order canonical.py does them (the two entry points below differ only in which pieces they stage).
struct CallPlan {
  // in
  const int64_t *s, *p, *r0, *len, *base, *end, *exp;
  int64_t n_runs, n_samples, tile, total_tiles;
  int64_t* block;
  // out
  std::vector<int64_t> slot0, slot1, lo, hi, free_list;
  int64_t c0 = 0, c1 = 0, cap = 0;

  CallPlan(const I64& sample, const I64& pos0, const I64& row0, const I64& length, const I64& slot_base,
           const I64& slot_end, const I64& expected, int64_t tile_, int64_t total_tiles_,
           py::array_t<int64_t, py::array::c_style>& block_of_tile, const std::vector<int64_t>& free_in,
           int64_t stage_blocks)
      : s(data(sample)), p(data(pos0)), r0(data(row0)), len(data(length)), base(data(slot_base)),
        end(data(slot_end)), exp(data(expected)), n_runs(sample.size()), n_samples(slot_base.size()),
        tile(tile_), total_tiles(total_tiles_), block(block_of_tile.mutable_data()), free_list(free_in),
        cap(stage_blocks) {}

  // _register: each run's slots, checked; merged into the received intervals (disjoint, touching ones joined)
  void register_runs(const I64& lo_in, const I64& hi_in) {
    slot0.resize(n_runs);
    slot1.resize(n_runs);
    int64_t s_max = -1;
    bool out_of_range = false;
    for (int64_t i = 0; i < n_runs; ++i) {
      s_max = std::max(s_max, s[i]);
      if (s[i] < 0 || s[i] >= n_samples) out_of_range = true;
    }
    if (out_of_range) {
      throw py::value_error("CanonicalFold: sample id " + std::to_string(s_max) + " outside the step's " +
                            std::to_string(n_samples) + " samples");
    }
    for (int64_t i = 0; i < n_runs; ++i) {
      slot0[i] = base[s[i]] + p[i];
      slot1[i] = slot0[i] + len[i];
      if (p[i] < 0 || end[s[i]] - slot1[i] < 0) {
        throw py::value_error("CanonicalFold: a row's position lies outside its sample");
      }
    }
    const int64_t n_old = lo_in.size();
    std::vector<std::pair<int64_t, int64_t>> iv;
    iv.reserve(n_old + n_runs);
    for (int64_t i = 0; i < n_old; ++i) iv.emplace_back(data(lo_in)[i], data(hi_in)[i]);
    for (int64_t i = 0; i < n_runs; ++i) iv.emplace_back(slot0[i], slot1[i]);
    std::stable_sort(iv.begin(), iv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    lo.reserve(iv.size());
    hi.reserve(iv.size());
    for (size_t k = 0; k < iv.size(); ++k) {
      if (k > 0) {
        const int64_t space = iv[k].first - iv[k - 1].second;
        if (space < 0) throw py::value_error("CanonicalFold: a token reached the fold twice");
        if (space == 0) {
          hi.back() = iv[k].second;
          continue;
        }
      }
      lo.push_back(iv[k].first);
      hi.push_back(iv[k].second);
    }
  }

  // _advance: the first incomplete tile at or after the cursor
  void advance(int64_t cursor) {
    c0 = c1 = cursor;
    const int64_t at = c0 * tile;
    const int64_t j = static_cast<int64_t>(std::upper_bound(lo.begin(), lo.end(), at) - lo.begin()) - 1;
    const int64_t h = j >= 0 ? hi[j] : at;
    if (h > at) c1 = std::min(floor_div(h, tile), total_tiles);
  }

  // _pieces of the runs in `order`: each run cut at tile boundaries
  template <class F>
  void for_each_piece(const std::vector<int64_t>& order, F&& f) const {
    for (int64_t i : order) {
      const int64_t a = slot0[i], b = slot1[i], shift = r0[i] - slot0[i];
      for (int64_t t = floor_div(a, tile); t * tile < b; ++t) {
        const int64_t first = std::max(a, t * tile);
        f(Piece{t, first, shift + first, std::min(b, (t + 1) * tile) - first});
      }
    }
  }

  // _stage_pieces: staging blocks for the staged pieces' tiles (fresh tiles take the lowest free blocks, the
  // capacity grown as _make_room does); the copy as ("slice", dst, src, rows) or ("index", [2, rows]: the
  // source and staging row of every staged row in piece order, _piece_rows) or, with as_pieces, ("pieces",
  // [pieces, 3] int32: the source row, staging row and length of every staged piece, for a piece copy), or None
  py::object stage(const std::vector<Piece>& staged, bool as_pieces) {
    if (staged.empty()) return py::none();
    std::vector<int64_t> tiles;
    tiles.reserve(staged.size());
    for (const Piece& pc : staged) tiles.push_back(pc.tile);
    std::sort(tiles.begin(), tiles.end());
    tiles.erase(std::unique(tiles.begin(), tiles.end()), tiles.end());
    std::vector<int64_t> fresh;
    for (int64_t t : tiles) {
      if (block[t] < 0) fresh.push_back(t);
    }
    if (fresh.size() > free_list.size()) {
      const int64_t need = cap - static_cast<int64_t>(free_list.size()) + static_cast<int64_t>(fresh.size());
      const int64_t grown = std::max({need, 2 * cap, int64_t{4}});
      for (int64_t b = cap; b < grown; ++b) free_list.push_back(b);
      cap = grown;
    }
    std::sort(free_list.begin(), free_list.end());
    for (size_t k = 0; k < fresh.size(); ++k) block[fresh[k]] = free_list[k];
    free_list.erase(free_list.begin(), free_list.begin() + static_cast<std::ptrdiff_t>(fresh.size()));
    if (staged.size() == 1) {
      const Piece& pc = staged[0];
      return py::make_tuple("slice", (block[pc.tile] - pc.tile) * tile + pc.lo, pc.row, pc.len);
    }
    if (as_pieces) {
      py::array_t<int32_t> pieces({static_cast<int64_t>(staged.size()), int64_t{3}});
      int32_t* q = pieces.mutable_data();
      for (const Piece& pc : staged) {
        *q++ = static_cast<int32_t>(pc.row);
        *q++ = static_cast<int32_t>((block[pc.tile] - pc.tile) * tile + pc.lo);
        *q++ = static_cast<int32_t>(pc.len);
      }
      return py::make_tuple("pieces", pieces);
    }
    int64_t rows = 0;
    for (const Piece& pc : staged) rows += pc.len;
    I64 index({int64_t{2}, rows});
    int64_t* src = index.mutable_data();
    int64_t* dst = src + rows;
    for (const Piece& pc : staged) {
      const int64_t d0 = (block[pc.tile] - pc.tile) * tile + pc.lo;
      for (int64_t j = 0; j < pc.len; ++j) {
        *src++ = pc.row + j;
        *dst++ = d0 + j;
      }
    }
    return py::make_tuple("index", index);
  }

  // _release: the ready tiles' blocks (-1: none), given back to the free list where staging exists
  std::vector<int64_t> release() {
    std::vector<int64_t> blocks(block + c0, block + c1);
    if (cap > 0) {  // (the fold has staging tensors exactly when it has staging blocks)
      for (int64_t t = c0; t < c1; ++t) {
        if (block[t] >= 0) free_list.push_back(block[t]);
        block[t] = -1;
      }
    }
    return blocks;
  }
};

// The plan of one take_tiles call (see CanonicalFold._plan_tiles), the call registered and advanced: desc
// [c1 - c0, 2] int32, stage_rows, in_place, the staging copy or None.
py::tuple describe_tiles(CallPlan& c, int64_t& cursor, bool stage, bool pieces) {
  const int64_t tile = c.tile;
  // runs in slot order when tiles are ready (the descriptors' order), else as given (numpy's argsort sorts
  // distinct keys: slots of different runs never coincide)
  std::vector<int64_t> order(c.n_runs);
  std::iota(order.begin(), order.end(), 0);
  if (c.c1 > c.c0 && !std::is_sorted(c.slot0.begin(), c.slot0.end())) {
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c.slot0[a] < c.slot0[b]; });
  }
  // direct: the piece's tile is ready and the piece holds all its rows; every other piece is staged
  std::vector<Piece> direct, staged;
  c.for_each_piece(order, [&](const Piece& pc) {
    (pc.tile < c.c1 && pc.len == c.exp[pc.tile] ? direct : staged).push_back(pc);
  });
  py::object copy = stage ? c.stage(staged, pieces) : py::none();
  py::array_t<int32_t> desc({c.c1 - c.c0, int64_t{2}});
  int32_t* d = desc.mutable_data();
  int64_t stage_rows = 0, in_place = 0;
  if (c.c1 > c.c0) {
    const std::vector<int64_t> blocks = c.release();
    int64_t top = -1;
    for (int64_t t = c.c0; t < c.c1; ++t) {
      const int64_t b = blocks[t - c.c0];
      top = std::max(top, b);
      d[2 * (t - c.c0)] = static_cast<int32_t>(b * -tile - 1);  // a split tile reads its staging block
      d[2 * (t - c.c0) + 1] = static_cast<int32_t>(c.exp[t]);
    }
    for (const Piece& pc : direct) {
      d[2 * (pc.tile - c.c0)] = static_cast<int32_t>(pc.row);
      in_place += pc.len;
    }
    stage_rows = (top + 1) * tile;
    cursor = c.c1;
  }
  return py::make_tuple(desc, stage_rows, in_place, copy);
}

// The plan of one take call (see CanonicalFold.take), the call registered and advanced: the ready tiles as a
// [c1 - c0, tile] int32 row table (staging rows 0 .. n_stage - 1 first, then the call's rows offset by n_stage;
// -1 a zero row), n_stage, the staging copy or None, whether every piece was ready.
py::tuple describe_table(CallPlan& c, int64_t& cursor, bool stage, bool pieces) {
  const int64_t tile = c.tile;
  std::vector<int64_t> order(c.n_runs);
  std::iota(order.begin(), order.end(), 0);  // runs as given
  std::vector<Piece> ready, staged;  // staged: every piece of a tile that is not ready
  c.for_each_piece(order, [&](const Piece& pc) { (pc.tile < c.c1 ? ready : staged).push_back(pc); });
  py::object copy = stage ? c.stage(staged, pieces) : py::none();
  const std::vector<int64_t> blocks = c.release();
  const int64_t n_ready = c.c1 - c.c0;
  int64_t n_stage = 0;
  for (int64_t b : blocks) n_stage = std::max(n_stage, (b + 1) * tile);
  py::array_t<int32_t> plan({n_ready, tile});
  int32_t* q = plan.mutable_data();
  for (int64_t t = 0; t < n_ready; ++t) {  // rows staged by earlier calls, in their blocks
    for (int64_t j = 0; j < tile; ++j) q[t * tile + j] = static_cast<int32_t>(blocks[t] >= 0 ? blocks[t] * tile + j : -1);
  }
  for (const Piece& pc : ready) {  // this call's rows, in place after the staging rows
    for (int64_t j = 0; j < pc.len; ++j) q[pc.lo - c.c0 * tile + j] = static_cast<int32_t>(n_stage + pc.row + j);
  }
  for (int64_t t = 0; t < n_ready; ++t) {  // a sample's short last tile: zero rows past its end
    for (int64_t j = c.exp[c.c0 + t]; j < tile; ++j) q[t * tile + j] = -1;
  }
  if (n_ready > 0) cursor = c.c1;
  return py::make_tuple(plan, n_stage, copy, staged.empty());
}

// One call of CanonicalFold.take_tiles (table false) or take (table true): the fold's state after it (lo, hi,
// cursor, free list, stage blocks after growth; the block table updated in place), then its plan (with pieces, its
// staging copy as pieces rather than a row index).
py::tuple plan_call(bool table, const I64& sample, const I64& pos0, const I64& row0, const I64& length,
                    const I64& slot_base, const I64& slot_end, const I64& expected, int64_t tile, int64_t total_tiles,
                    const I64& lo_in, const I64& hi_in, int64_t cursor,
                    py::array_t<int64_t, py::array::c_style> block_of_tile, const std::vector<int64_t>& free_in,
                    int64_t stage_blocks, bool stage, bool pieces) {
  CallPlan c(sample, pos0, row0, length, slot_base, slot_end, expected, tile, total_tiles, block_of_tile, free_in,
             stage_blocks);
  c.register_runs(lo_in, hi_in);
  c.advance(cursor);
  py::tuple plan = table ? describe_table(c, cursor, stage, pieces) : describe_tiles(c, cursor, stage, pieces);
  return py::make_tuple(vec_array(c.lo), vec_array(c.hi), cursor, c.free_list, c.cap, plan);
}

// The canonical tile sequence of (lengths, tile) (see canonical._Layout): (tiles_per_sample, total_tiles,
// slot_base, slot_end, lo, hi, nonempty, tile_first, expected); a negative length is refused as there.
py::tuple layout(const I64& lengths, int64_t tile) {
  const int64_t n = lengths.size();
  const int64_t* len = data(lengths);
  for (int64_t i = 0; i < n; ++i) {
    if (len[i] < 0) throw py::value_error("CanonicalFold: sample lengths must be >= 0");
  }
  I64 tiles_per_sample(n), slot_base(n), slot_end(n);
  int64_t *tps = tiles_per_sample.mutable_data(), *base = slot_base.mutable_data(), *end = slot_end.mutable_data();
  std::vector<int64_t> lo, hi;
  int64_t tiles = 0, nonempty = 0;
  for (int64_t i = 0; i < n; ++i) {
    tps[i] = (len[i] + (tile - 1)) / tile;
    base[i] = tiles * tile;
    tiles += tps[i];
    end[i] = base[i] + len[i];
    nonempty += tps[i] != 0;
    if (end[i] < tiles * tile) {  // the absent slots of the sample's last tile
      lo.push_back(end[i]);
      hi.push_back(tiles * tile);
    }
  }
  I64 tile_first(tiles), expected(tiles);
  int64_t *first = tile_first.mutable_data(), *exp = expected.mutable_data();
  for (int64_t i = 0, t = 0; i < n; ++i) {
    for (int64_t k = 0; k < tps[i]; ++k, ++t) {
      first[t] = t * tile;
      exp[t] = std::min(end[i] - first[t], tile);
    }
  }
  return py::make_tuple(tiles_per_sample, tiles, slot_base, slot_end, vec_array(lo), vec_array(hi), nonempty,
                        tile_first, expected);
}

// canonical._Layout.whole_step: row0 of every tile when one call holds every sample whole, else None.
py::object whole_step(const I64& sample, const I64& pos0, const I64& row0, const I64& length, const I64& lengths,
                      const I64& slot_base, const I64& tiles_per_sample, int64_t tile, int64_t total_tiles,
                      int64_t nonempty) {
  const int64_t n_runs = sample.size(), n = lengths.size();
  if (n_runs != nonempty || total_tiles == 0) return py::none();
  const int64_t *s = data(sample), *p = data(pos0), *r0 = data(row0), *len = data(length);
  std::vector<int64_t> row_of(n, -1);
  for (int64_t i = 0; i < n_runs; ++i) {
    // a run not at position 0, a sample outside the step, a run shorter than its sample, a sample twice: the
    // general path (which also raises what is wrong)
    if (p[i] != 0 || s[i] < 0 || s[i] >= n || data(lengths)[s[i]] != len[i] || row_of[s[i]] >= 0) return py::none();
    row_of[s[i]] = r0[i];
  }
  I64 out(total_tiles);
  int64_t* o = out.mutable_data();
  const int64_t *tps = data(tiles_per_sample), *base = data(slot_base);
  for (int64_t i = 0, t = 0; i < n; ++i) {
    for (int64_t k = 0; k < tps[i]; ++k, ++t) o[t] = row_of[i] - base[i] + t * tile;
  }
  return std::move(out);
}

// canonical._packed_runs_small: the runs of pieces packed one after another, merged where a piece continues the
// previous one; ([4, runs] table of sample, pos0, row0, length; total rows), or None where a length is negative
// (the general path's checks). ids / starts empty: 0 .. n-1 / all 0.
py::object packed_runs(const std::vector<int64_t>& lengths, const std::vector<int64_t>& ids,
                       const std::vector<int64_t>& starts) {
  const size_t count = lengths.size();
  std::vector<int64_t> out_s, out_p, out_r, out_n;
  int64_t row = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t length = lengths[i], sid = ids.empty() ? static_cast<int64_t>(i) : ids[i];
    const int64_t first = starts.empty() ? 0 : starts[i];
    if (length < 0) return py::none();
    if (length == 0) continue;
    if (sid < 0) throw py::value_error("RowIdentity.from_runs: runs must hold sample ids >= 0 and lie inside the rows");
    if (!out_s.empty() && out_s.back() == sid && out_p.back() + out_n.back() == first &&
        out_r.back() + out_n.back() == row) {
      out_n.back() += length;  // continues the previous run: same sample, next position, next row
    } else {
      out_s.push_back(sid);
      out_p.push_back(first);
      out_r.push_back(row);
      out_n.push_back(length);
    }
    row += length;
  }
  const int64_t k = static_cast<int64_t>(out_s.size());
  I64 table({int64_t{4}, k});
  int64_t* t = table.mutable_data();
  for (const auto* v : {&out_s, &out_p, &out_r, &out_n}) t = std::copy(v->begin(), v->end(), t);
  return py::make_tuple(table, row);
}

}  // namespace

PYBIND11_MODULE(_fold_plan, m) {
  m.def("packed_runs", &packed_runs);
  m.doc() = "The canonical fold's host planning (see csrc/host/fold_plan.cpp)";
  m.def("plan_call", &plan_call);
  m.def("layout", &layout);
  m.def("whole_step", &whole_step);
}
