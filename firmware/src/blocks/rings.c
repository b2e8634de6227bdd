/* A prefill batch over windowed layers' rings: the rows a pass overwrites saved, put back, exchanged.
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* ---- a prefill batch and the window rings ----
 * A pass of n tokens at positions pos .. pos + n - 1 stores token t's K/V row into a windowed layer's ring (W
 * rows, position p in row p % W) just before t attends, so inside the layer no token meets a row a later one
 * wrote. Two readers come after the whole pass has written its rows, and would meet them: the replay of a
 * failed pass (one token at a time, colibri_feed), which must find the rings as they were before it, and a
 * Gemma 4 layer sharing an earlier layer's ring, whose token t must find it as it was after token t. So a
 * pass first saves the m = min(n, W) ring rows it will overwrite (row (pos + j) % W as saved row j) of every
 * windowed layer that owns its cache, into the prefill batch region (batch_plan); a failed pass puts them
 * back (model_forward), and a sharing layer exchanges them with the pass's rows (attention_mha). */

/* Ring rows (pos + j) % W of `layer` (its cache from element layer_base on), K then V, for j in [j0, j1),
 * against its saved rows j: copied there, or with `swap` exchanged (what restores them too: the saved copy is
 * not read again). Bytes: the rows are in the cache's dtype and no row is 4-byte aligned for certain. */
static void ring_rows(const colibri_ctx *c, uint32_t layer, size_t layer_base, uint8_t *saved, uint32_t j0, uint32_t j1,
                      int swap) {
    const size_t elem = c->d.kv_dtype == KV_F16 ? 2 : 4, row_bytes = (size_t)layer_kv_dim(&c->d, layer) * elem;
    uint8_t *const cache[2] = { c->a.k_cache, c->a.v_cache }; /* MLA: no V cache */
    for (uint32_t k = 0; k < 2 && cache[k]; k++, saved += c->rings.rows * row_bytes)
        for (uint32_t j = j0; j < j1; j++) {
            uint8_t *r = cache[k] + layer_base * elem + (size_t)((c->pos + j) % c->d.window) * row_bytes;
            for (size_t i = 0; i < row_bytes; i++) {
                const uint8_t kept = saved[j * row_bytes + i];
                saved[j * row_bytes + i] = r[i];
                if (swap) r[i] = kept;
            }
        }
}

/* Every cache-owning windowed layer's ring rows this pass overwrites: saved before it, or (swap) put back after
 * it failed. */
static void rings_save(const colibri_ctx *c, uint32_t n, int swap) {
    const model_dims *d = &c->d;
    const uint32_t m = n < d->window ? n : d->window;
    uint8_t *saved = c->rings.saved;
    size_t layer_base = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if (layer_windowed(d, l)) {
            ring_rows(c, l, layer_base, saved, 0, m, swap);
            saved += (c->a.v_cache ? 2u : 1u) * c->rings.rows * (size_t)layer_kv_dim(d, l) * (d->kv_dtype == KV_F16 ? 2 : 4);
        }
        layer_base += (size_t)kv_rows(d, l) * layer_kv_dim(d, l);
    }
}
