/* The explorer of an explain run (explain/viewer/explorer.js): plain JavaScript, no library.
 *
 * Input: `explorerSetup` (the run and the shared tables: methods, targets, metric columns,
 * class names) and `explorerData`, the chunks that the data files pushed, each column by
 * column (see explain/viewer/__init__.py). They are joined into typed arrays once; a change of
 * a control filters and sorts the image indices (`view`), and only the rows in sight are drawn
 * (virtual scrolling over rows of a fixed height).
 */
(function () {
  "use strict";
  var setup = explorerSetup, tables = setup.tables, run = setup.run;
  var STATUS = ["done now", "done before", "failed"];
  var $ = function (id) { return document.getElementById(id); };

  // ---- the data, joined into columns
  var nImages = 0, nMaps = 0;
  explorerData.forEach(function (c) { nImages += c.images.name.length; nMaps += c.maps.image.length; });
  var names = new Array(nImages), originals = new Array(nImages);
  var predicted = new Int32Array(nImages), probability = new Float64Array(nImages);
  var label = new Int32Array(nImages), correct = new Int8Array(nImages), rank = new Int32Array(nImages);
  var mapStart = new Int32Array(nImages + 1);
  var mMethod = new Int16Array(nMaps), mTarget = new Int16Array(nMaps), mClass = new Int32Array(nMaps);
  var mProbability = new Float64Array(nMaps), mStatus = new Int8Array(nMaps), mSeconds = new Float64Array(nMaps);
  var mOutput = new Array(nMaps), mError = new Array(nMaps);
  // a concept method's maps (--method crp): each one concept's (LAYER:CHANNEL), its rank and relevance
  var mConcept = new Array(nMaps), mConceptRank = new Int16Array(nMaps), mRelevance = new Float64Array(nMaps);
  var metricValues = tables.metric.map(function () { return new Float64Array(nMaps).fill(NaN); });
  var hasMetric = tables.metric.map(function () { return new Uint8Array(tables.method.length); });
  var num = function (v, missing) { return v === null || v === undefined ? missing : v; };
  (function join() {
    var i0 = 0, m0 = 0;
    explorerData.forEach(function (c) {
      var im = c.images, mp = c.maps, n = im.name.length, k = mp.image.length, i, m;
      for (i = 0; i < n; i++) {
        names[i0 + i] = im.name[i]; originals[i0 + i] = im.original[i];
        predicted[i0 + i] = num(im.predicted[i], -1); probability[i0 + i] = num(im.probability[i], NaN);
        label[i0 + i] = num(im.label[i], -1); correct[i0 + i] = num(im.correct[i], -1); rank[i0 + i] = im.rank[i];
      }
      for (m = 0; m < k; m++) {
        var g = m0 + m;
        mapStart[i0 + mp.image[m] + 1] = g + 1;
        mMethod[g] = mp.method[m]; mTarget[g] = mp.target[m]; mClass[g] = num(mp.target_id[m], -1);
        mProbability[g] = num(mp.probability[m], NaN); mStatus[g] = mp.status[m];
        mSeconds[g] = num(mp.seconds[m], NaN); mOutput[g] = mp.output[m]; mError[g] = mp.error[m];
        mConcept[g] = mp.concept ? mp.concept[m] : null;
        mConceptRank[g] = mp.concept_rank ? num(mp.concept_rank[m], 0) : 0;
        mRelevance[g] = mp.concept_relevance ? num(mp.concept_relevance[m], NaN) : NaN;
      }
      mp.metrics.forEach(function (t) {
        if (t[2] !== null) { metricValues[t[1]][m0 + t[0]] = t[2]; hasMetric[t[1]][mp.method[t[0]]] = 1; }
      });
      i0 += n; m0 += k;
    });
    for (var i = 1; i <= nImages; i++) { if (mapStart[i] < mapStart[i - 1]) mapStart[i] = mapStart[i - 1]; }
  })();
  setup.times.joined = performance.now();  // when the columns are ready (bench_viewer.py reads the times)
  var byName = new Int32Array(nImages);
  for (var r = 0; r < nImages; r++) byName[rank[r]] = r;
  var className = {};
  tables.classes.forEach(function (pair) { className[pair[0]] = pair[1]; });
  var atlasConcepts = {};  // explain run --atlas: the concepts the atlas has a page for
  if (run.atlas) run.atlas.concepts.forEach(function (key) { atlasConcepts[key] = 1; });
  var hasLabels = false;
  for (var j = 0; j < nImages && !hasLabels; j++) hasLabels = label[j] >= 0;

  // ---- explain strategies' clusters (index-data/strategies.js), joined to the maps by their
  // key (image, method, target): mCluster[g] indexes `clusters`, -1 where the map has none
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
  var strategies = typeof explorerStrategies === "undefined" ? null : explorerStrategies;
  var clusters = [], mCluster = new Int16Array(nMaps).fill(-1), itemImage = [], stale = {redone: 0, gone: 0, added: 0};
  (function joinClusters() {
    if (!strategies) return;
    // maps keyed by file, method and class names: no prototype (a class named "constructor")
    var first = [], imageOf = Object.create(null), methods = Object.create(null), k, g;
    strategies.classes.forEach(function (entry, c) {
      first.push(clusters.length);
      entry.clusters.forEach(function (cluster) {
        clusters.push({cls: c, cluster: cluster.cluster, label: entry.name + " · c" + cluster.cluster,
                       colour: PALETTE[cluster.cluster % PALETTE.length]});
      });
    });
    for (var i = 0; i < nImages; i++) imageOf[names[i]] = i;
    var items = strategies.items;
    for (k = 0; k < items.input.length; k++) {
      var image = items.input[k] in imageOf ? imageOf[items.input[k]] : -1, found = false;
      methods[items.method[k]] = 1;
      itemImage.push(image);
      for (g = image < 0 ? 0 : mapStart[image]; image >= 0 && g < mapStart[image + 1]; g++) {
        if (tables.method[mMethod[g]] !== items.method[k] || tables.target[mTarget[g]] !== items.target[k]) continue;
        if (!found && items.seconds[k] !== null && !isNaN(mSeconds[g]) && Math.abs(mSeconds[g] - items.seconds[k]) > 1e-9) stale.redone++;
        if (mStatus[g] === 2) continue;
        mCluster[g] = first[items["class"][k]] + items.cluster[k];
        found = true;
      }
      if (!found) stale.gone++;
    }
    var named = Object.create(null);  // the classes clustered (those left out, or not asked for, have no clusters)
    strategies.classes.forEach(function (entry) { named[entry.name] = 1; });
    for (g = 0; g < nMaps; g++) {  // maps of a method and class clustered that no item has: explained since
      if (mCluster[g] < 0 && mStatus[g] !== 2 && methods[tables.method[mMethod[g]]] && named[className[mClass[g]]]) {
        stale.added++;
      }
    }
  })();

  // ---- small helpers
  function esc(text) {
    return String(text).replace(/[&<>"']/g, function (ch) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[ch];
    });
  }
  function percent(p) { return isNaN(p) ? "" : (100 * p).toFixed(1) + "%"; }
  function fixed(v) { return isNaN(v) ? "–" : Math.abs(v) >= 1000 || (v !== 0 && Math.abs(v) < 0.001) ? v.toExponential(2) : (+v.toFixed(3)).toString(); }
  function cls(id) { return id < 0 ? "" : (className[id] !== undefined ? className[id] : "class " + id); }
  function option(select, value, text) {
    var o = document.createElement("option"); o.value = value; o.textContent = text; select.appendChild(o);
  }
  function seconds(s) { return s >= 10 ? s.toFixed(0) + " s" : s >= 1 ? s.toFixed(1) + " s" : (1000 * s).toFixed(0) + " ms"; }

  // ---- the header: what this run did
  function header() {
    var counts = run.counts, methods = tables.method.length;
    if (!counts) {
      counts = {ok: 0, skipped: 0, failed: 0};
      for (var g = 0; g < nMaps; g++) counts[["ok", "skipped", "failed"][mStatus[g]]]++;
    }
    $("title").textContent = run.command + ": " + nImages.toLocaleString() + " image" + (nImages === 1 ? "" : "s") +
      " × " + methods + " method" + (methods === 1 ? "" : "s");
    document.title = $("title").textContent;
    var parts = ["done now <b>" + counts.ok.toLocaleString() + "</b>",
                 "done before <b>" + counts.skipped.toLocaleString() + "</b> (skipped)",
                 "failed <b>" + counts.failed.toLocaleString() + "</b>"];
    if (run.seconds !== null && run.seconds !== undefined) {
      var explained = run.images ? run.images.toLocaleString() + " image" + (run.images === 1 ? "" : "s") +
        " explained" : "no images explained";
      parts.push("this run: " + seconds(run.seconds) + ", " + explained);
    }
    if (hasLabels) {  // --labels: the images whose top class is not their label
      var labelled = 0, wrong = 0;
      for (var i = 0; i < nImages; i++) { if (correct[i] >= 0) { labelled++; if (!correct[i]) wrong++; } }
      parts.push('<span id="mistakes">mistakes <b>' + wrong.toLocaleString() + "</b> of " +
                 labelled.toLocaleString() + " labelled image" + (labelled === 1 ? "" : "s") + "</span>");
    }
    var state = run.state === "complete" ? "" : ' <span class="state">' + esc(run.state) + "</span>";
    $("counts").innerHTML = parts.join(" · ") + state;
    $("summary").textContent = run.summary || "";
    if ($("metric-summary").querySelector("table")) $("metric-summary").hidden = false;
  }

  // ---- failures, first and in their own section
  function failures() {
    var list = $("failure-list"), shown = 0, total = 0, limit = 200, html = [];
    for (var i = 0; i < nImages; i++) {
      for (var g = mapStart[i]; g < mapStart[i + 1]; g++) {
        if (mStatus[g] !== 2) continue;
        total++;
        if (shown++ < limit) {
          html.push('<li><a href="#" data-image="' + i + '">' + esc(names[i]) + "</a> — " +
            esc(tables.method[mMethod[g]]) + ': <span class="reason">' + esc(mError[g] || "failed") + "</span></li>");
        }
      }
    }
    if (!total) return;
    list.innerHTML = html.join("");
    $("failures").hidden = false;
    $("failures").querySelector("h2").textContent = "Failures (" + total.toLocaleString() + ")";
    if (total > limit) $("failure-more").textContent = "and " + (total - limit).toLocaleString() +
      " more: choose status ‘failed’ below to see them all";
    list.addEventListener("click", function (event) {
      var a = event.target.closest("a[data-image]");
      if (a) { event.preventDefault(); openDetail(+a.dataset.image); }
    });
  }

  // ---- the controls
  var metricKeys = [];  // [method, metric column] pairs that have values
  function controls() {
    var methods = $("methods");
    tables.method.forEach(function (name, m) {
      var l = document.createElement("label"), box = document.createElement("input");
      box.type = "checkbox"; box.checked = true; box.value = m; box.className = "method";
      l.appendChild(box); l.appendChild(document.createTextNode(" " + name)); methods.appendChild(l);
    });
    option($("target"), -1, "each image's first");  // boxes of a detector differ from image to image
    tables.target.forEach(function (name, t) { option($("target"), t, name); });
    if (tables.target.length < 2) $("target").parentNode.hidden = true;
    var targets = {}, preds = {};
    for (var g = 0; g < nMaps; g++) if (mClass[g] >= 0) targets[mClass[g]] = 1;
    for (var i = 0; i < nImages; i++) if (predicted[i] >= 0) preds[predicted[i]] = 1;
    var byLabel = function (a, b) { return cls(a).localeCompare(cls(b)); };
    Object.keys(targets).map(Number).sort(byLabel).forEach(function (id) { option($("target-class"), id, cls(id) + " (" + id + ")"); });
    Object.keys(preds).map(Number).sort(byLabel).forEach(function (id) { option($("predicted-class"), id, cls(id) + " (" + id + ")"); });
    $("correct-control").hidden = !hasLabels;
    var sort = $("sort");
    option(sort, "name", "name");
    option(sort, "prob-desc", "probability, high first");
    option(sort, "prob-asc", "probability, low first");
    tables.metric.forEach(function (column, k) {
      tables.method.forEach(function (method, m) {
        if (!hasMetric[k][m]) return;
        metricKeys.push([m, k]);
        var key = (metricKeys.length - 1), text = method + " · " + column;
        option($("metric"), key, text);
        option(sort, "metric-desc-" + key, text + ", high first");
        option(sort, "metric-asc-" + key, text + ", low first");
      });
    });
    $("metric-control").hidden = !metricKeys.length;
    if (clusters.length) {
      $("cluster-control").hidden = false;
      clusters.forEach(function (cluster, k) { option($("cluster"), k, cluster.label); });
      option(sort, "cluster-asc", "cluster (grouped)");
    }
    // text and number fields answer as they are typed in, lists and boxes when they change
    $("controls").addEventListener("input", function (event) {
      var kind = event.target.type;
      if (event.target.id === "opacity") opacity();
      else if (kind === "text" || kind === "search" || kind === "number") apply();
    });
    $("controls").addEventListener("change", function (event) {
      if (event.target.id === "overlay-on") overlaySwitch();
      else if (event.target.tagName === "SELECT" || event.target.type === "checkbox") apply();
    });
  }
  function opacity() { document.documentElement.style.setProperty("--overlay-opacity", $("opacity").value / 100); }
  function overlaySwitch() { document.body.classList.toggle("no-overlay", !$("overlay-on").checked); }

  // ---- filtering and sorting: `view` holds the indices of the images shown, in order
  var view = new Int32Array(0), shownMethods = [], target = -1;  // target: an index of tables.target, or -1: the first
  function mapOf(i, m) {
    for (var g = mapStart[i]; g < mapStart[i + 1]; g++) {
      if (mMethod[g] === m && (target < 0 || mTarget[g] === target)) return g;
    }
    return -1;
  }
  function number(id, fallback) { var v = parseFloat($(id).value); return isNaN(v) ? fallback : v; }

  function state() {
    var boxes = document.querySelectorAll("#methods input.method"), methods = [];
    for (var b = 0; b < boxes.length; b++) if (boxes[b].checked) methods.push(+boxes[b].value);
    var metric = $("metric").value === "" ? null : metricKeys[+$("metric").value];
    return {
      methods: methods, target: +$("target").value,
      search: $("search").value.trim().toLowerCase(),
      targetClass: $("target-class").value === "" ? -1 : +$("target-class").value,
      predictedClass: $("predicted-class").value === "" ? -1 : +$("predicted-class").value,
      status: $("status").value === "" ? -1 : +$("status").value,
      correct: $("correct").value === "" ? null : +$("correct").value,
      cluster: $("cluster").value === "" ? null : +$("cluster").value,
      pmin: number("prob-min", -Infinity), pmax: number("prob-max", Infinity),
      metric: metric, mmin: number("metric-min", -Infinity), mmax: number("metric-max", Infinity),
      sort: $("sort").value
    };
  }

  // an image's cluster: that of its first clustered map of the target chosen (-1: none)
  function clusterOf(i) {
    for (var g = mapStart[i]; g < mapStart[i + 1]; g++) {
      if (mCluster[g] >= 0 && (target < 0 || mTarget[g] === target)) return mCluster[g];
    }
    return -1;
  }
  function keeps(i, s) {
    if (s.predictedClass >= 0 && predicted[i] !== s.predictedClass) return false;
    if (s.cluster !== null && clusterOf(i) !== s.cluster) return false;
    if (s.correct !== null && correct[i] !== s.correct) return false;
    var p = probability[i];
    if ((s.pmin > -Infinity || s.pmax < Infinity) && !(p >= s.pmin && p <= s.pmax)) return false;
    if (s.search && names[i].toLowerCase().indexOf(s.search) < 0) return false;
    if (s.targetClass >= 0 || s.status >= 0) {
      var found = false;
      for (var g = mapStart[i]; g < mapStart[i + 1] && !found; g++) {
        found = s.methods.indexOf(mMethod[g]) >= 0 && (s.targetClass < 0 || mClass[g] === s.targetClass) &&
          (s.status < 0 || mStatus[g] === s.status);
      }
      if (!found) return false;
    }
    if (s.metric && (s.mmin > -Infinity || s.mmax < Infinity)) {
      var m = mapOf(i, s.metric[0]), v = m < 0 ? NaN : metricValues[s.metric[1]][m];
      if (!(v >= s.mmin && v <= s.mmax)) return false;
    }
    return true;
  }

  function sortKey(s) {
    if (s.sort.indexOf("prob-") === 0) return probability;
    if (s.sort === "cluster-asc") {  // grouped by cluster, the images without one last
      var grouped = new Float64Array(nImages);
      for (var c = 0; c < nImages; c++) { var k = clusterOf(c); grouped[c] = k < 0 ? NaN : k; }
      return grouped;
    }
    if (s.sort.indexOf("metric-") === 0) {
      var key = metricKeys[+s.sort.split("-")[2]], values = metricValues[key[1]], out = new Float64Array(nImages);
      for (var i = 0; i < nImages; i++) { var m = mapOf(i, key[0]); out[i] = m < 0 ? NaN : values[m]; }
      return out;
    }
    return null;
  }

  function apply() {
    var started = performance.now(), s = state(), kept = new Int32Array(nImages), n = 0;
    shownMethods = s.methods; target = s.target;
    for (var r = 0; r < nImages; r++) { var i = byName[r]; if (keeps(i, s)) kept[n++] = i; }
    view = kept.subarray(0, n);
    var key = sortKey(s);
    if (key) {
      var sign = s.sort.indexOf("-asc") > 0 ? 1 : -1;
      view.sort(function (a, b) {
        var x = key[a], y = key[b];
        if (x !== x) return y !== y ? rank[a] - rank[b] : 1;  // no value: last
        if (y !== y) return -1;
        return x === y ? rank[a] - rank[b] : sign * (x - y);
      });
    }
    $("shown").textContent = n.toLocaleString() + " of " + nImages.toLocaleString() + " images shown";
    drawHead();
    $("canvas").style.height = n * rowHeight + "px";
    $("grid").scrollTop = 0;
    drawn = -1;
    draw();
    window.explorerLastApply = performance.now() - started;
  }

  // ---- the grid: the header row and the rows in sight
  var rowHeight = 0, drawn = -1, OVERSCAN = 3;
  function scaleOf(m) {
    var scale = run.scales && run.scales[tables.method[m]];
    if (!scale) return "";
    return '<div class="scale" style="background:' + esc(scale.gradient) + '" title="colour scale: ' + esc(scale.cmap) +
      '"></div><div class="ends"><span>' + esc(scale.ends[0]) + "</span><span>" + esc(scale.ends[1]) + "</span><span>" +
      esc(scale.ends[2]) + "</span></div>";
  }
  function drawHead() {
    var html = ['<div class="name" role="columnheader">image<br><span class="muted">prediction</span></div>',
                '<div role="columnheader">original</div>'];
    shownMethods.forEach(function (m) { html.push('<div role="columnheader">' + esc(tables.method[m]) + scaleOf(m) + "</div>"); });
    $("head").innerHTML = html.join("");
  }
  function base(i) {
    return originals[i] ? '<img class="base" src="' + esc(originals[i]) + '" alt="" loading="lazy"' + zoomStyle() + ">" : "";
  }
  function zoomStyle() { return run.zoom ? ' style="transform:scale(' + run.zoom + ')"' : ""; }
  function overlayImage(g, m, lazy) {
    return mOutput[g] ? '<img class="overlay" src="' + esc(mOutput[g]) + '" alt="' + esc(tables.method[m]) + '"' +
      (lazy ? ' loading="lazy"' : "") + ">" : "";
  }
  function metricText(g, m) {
    var parts = [];
    tables.metric.forEach(function (column, k) {
      if (hasMetric[k][m]) parts.push(column + " " + fixed(metricValues[k][g]));
    });
    return parts.join(" · ");
  }
  function cell(i, m) {
    var g = mapOf(i, m);
    if (g < 0) return '<div class="cell empty">—</div>';
    if (mStatus[g] === 2 || mError[g]) {
      return '<div class="cell failed" role="gridcell"><span class="reason">' + esc(mError[g] || "failed") + "</span></div>";
    }
    var cap = esc(cls(mClass[g])) + " " + percent(mProbability[g]), metrics = metricText(g, m);
    if (mConcept[g]) cap += " · " + esc(mConcept[g]);  // a concept method's first concept
    return '<div class="cell" role="gridcell"><div class="pic">' + base(i) + overlayImage(g, m, true) +
      '</div><div class="cap">' + cap + (metrics ? "<br>" + esc(metrics) : "") + "</div></div>";
  }
  function verdict(i) {
    if (correct[i] < 0) return "";
    return correct[i] ? '<div class="verdict-right">✓ right (' + esc(cls(label[i])) + ")</div>"
      : '<div class="verdict-wrong">✗ wrong: is ' + esc(cls(label[i])) + "</div>";
  }
  function clusterChip(i) {
    var k = clusterOf(i);
    if (!clusters.length) return "";
    if (k < 0) return '<div class="cluster-chip none" data-cluster="-1">no cluster</div>';
    return '<div class="cluster-chip" data-cluster="' + k + '" style="border-color:' + clusters[k].colour + '">' +
      '<span class="swatch" style="background:' + clusters[k].colour + '"></span>' + esc(clusters[k].label) + "</div>";
  }
  function row(position) {
    var i = view[position];
    var html = ['<div class="row" role="row" style="top:' + position * rowHeight + 'px" data-image="' + i + '">',
      '<div class="name" role="rowheader"><div class="file">' + esc(names[i]) + "</div>" + clusterChip(i) +
      (predicted[i] >= 0 ? "<div>" + esc(cls(predicted[i])) + " " + percent(probability[i]) + "</div>" :
        '<div class="muted">no prediction</div>') + verdict(i) +
      '<button type="button" class="open">details</button></div>',
      '<div class="original">' + (originals[i] ? '<div class="pic"><img src="' + esc(originals[i]) +
        '" alt="original" loading="lazy"></div>' : '<span class="empty">not in reach</span>') + "</div>"];
    shownMethods.forEach(function (m) { html.push(cell(i, m)); });
    html.push("</div>");
    return html.join("");
  }
  function draw() {
    var grid = $("grid"), top = Math.max(0, grid.scrollTop - $("head").offsetHeight);
    var first = Math.max(0, Math.floor(top / rowHeight) - OVERSCAN);
    if (first === drawn) return;
    drawn = first;
    var last = Math.min(view.length, Math.ceil((top + grid.clientHeight) / rowHeight) + OVERSCAN), html = [];
    for (var p = first; p < last; p++) html.push(row(p));
    $("canvas").innerHTML = html.join("");
  }

  // ---- the detail view: every method for one image, side by side
  function openDetail(i) {
    var html = ["<h2>" + esc(names[i]) + "</h2>"];
    html.push("<p>prediction: " + (predicted[i] >= 0 ? esc(cls(predicted[i])) + " (" + predicted[i] + ") " +
      percent(probability[i]) : "none") + "</p>" + verdict(i) + clusterChip(i));
    var top = {};
    for (var g = mapStart[i]; g < mapStart[i + 1]; g++) {
      if (mClass[g] >= 0 && !isNaN(mProbability[g])) top[mClass[g]] = mProbability[g];
    }
    var ranked = Object.keys(top).map(Number).sort(function (a, b) { return top[b] - top[a]; });
    if (ranked.length) {
      html.push("<table><caption>top predictions (the targets explained)</caption>" + ranked.map(function (id) {
        return "<tr><td>" + esc(cls(id)) + " (" + id + ")</td><td>" + percent(top[id]) + "</td></tr>";
      }).join("") + "</table>");
    }
    html.push('<div class="figures">');
    if (originals[i]) {
      html.push('<figure><div class="pic"><img src="' + esc(originals[i]) + '" alt="original"></div><figcaption>original</figcaption></figure>');
    }
    var concepts = [];  // the maps of a concept method (--method crp), shown below, by target
    for (g = mapStart[i]; g < mapStart[i + 1]; g++) {
      var m = mMethod[g], title = esc(tables.method[m]) + " · " + esc(tables.target[mTarget[g]]);
      if (mConcept[g] && !(mStatus[g] === 2 || mError[g])) { concepts.push(g); continue; }
      if (mStatus[g] === 2 || mError[g]) {
        html.push('<figure class="failed"><figcaption>' + title + ': <span class="reason">' + esc(mError[g] || "failed") + "</span></figcaption></figure>");
        continue;
      }
      var metrics = metricText(g, m);
      html.push('<figure><div class="pic">' + base(i) + overlayImage(g, m, false) + "</div>" + scaleOf(m) + "<figcaption>" + title + ": " + esc(cls(mClass[g])) + " " + percent(mProbability[g]) +
        " · " + STATUS[mStatus[g]] + (isNaN(mSeconds[g]) ? "" : " · " + seconds(mSeconds[g])) +
        (metrics ? "<br>" + esc(metrics) : "") + "</figcaption></figure>");
    }
    html.push("</div>");
    html.push(conceptFigures(i, concepts));
    $("detail-body").innerHTML = html.join("");
    $("detail").showModal();
  }

  // an image's concepts (--method crp): per method and target, its top concepts with their
  // conditional maps and relevances, each linked to its page in the atlas (explain run --atlas)
  function conceptName(key) {
    if (!atlasConcepts[key]) return esc(key);
    var href = run.atlas.page + "#" + encodeURIComponent(key).replace(/%3A/g, ":");
    return '<a class="concept-link" href="' + esc(href) + '" target="_blank" title="its page in the concept atlas">' +
      esc(key) + "</a>";
  }
  function conceptFigures(i, maps) {
    var groups = [], byKey = {};
    maps.forEach(function (g) {
      var key = mMethod[g] + "/" + mTarget[g];
      if (!byKey[key]) { byKey[key] = []; groups.push(byKey[key]); }
      byKey[key].push(g);
    });
    return groups.map(function (group) {
      var first = group[0], m = mMethod[first];
      var html = ['<section class="concepts-of"><h3>' + esc(tables.method[m]) + " · " + esc(tables.target[mTarget[first]]) +
        ": the concepts of " + esc(cls(mClass[first])) + " " + percent(mProbability[first]) + "</h3>" + scaleOf(m) +
        '<div class="figures">'];
      group.sort(function (a, b) { return mConceptRank[a] - mConceptRank[b]; });
      group.forEach(function (g) {
        html.push('<figure class="concept-map" data-concept="' + esc(mConcept[g]) + '"><div class="pic">' + base(i) +
          overlayImage(g, m, false) + "</div><figcaption>" + mConceptRank[g] + ". " + conceptName(mConcept[g]) +
          " · relevance " + fixed(mRelevance[g]) + " · " + STATUS[mStatus[g]] + "</figcaption></figure>");
      });
      html.push("</div></section>");
      return html.join("");
    }).join("");
  }

  // ---- what the strategies view (strategies.js) uses of the explorer
  window.explorerView = {
    strategies: strategies, clusters: clusters, itemImage: itemImage, stale: stale, names: names,
    originals: originals, openDetail: openDetail, esc: esc, percent: percent,
    showCluster: function (k) {  // the grid filtered to one cluster (k: an index of clusters)
      $("cluster").value = String(k);
      apply();
      $("controls").scrollIntoView();
    }
  };

  // ---- start
  header();
  failures();
  controls();
  $("canvas").innerHTML = '<div class="row"><div class="name">x</div></div>';
  rowHeight = $("canvas").firstChild.offsetHeight || 206;
  $("grid").addEventListener("scroll", function () { window.requestAnimationFrame(draw); });
  window.addEventListener("resize", function () { drawn = -1; draw(); });
  $("canvas").addEventListener("click", function (event) {
    var button = event.target.closest("button.open");
    if (button) openDetail(+button.closest(".row").dataset.image);
  });
  // An original that does not load: index.html links the inputs relatively from the run
  // folder, so a folder moved away from them loses them (explain run --copy-originals keeps
  // thumbnails inside it instead).
  document.addEventListener("error", function (event) {
    var img = event.target;
    if (img.tagName !== "IMG" || img.alt !== "original" || !img.parentNode) return;
    var note = document.createElement("span");
    note.className = "empty missing-original";
    note.textContent = "original not found";
    note.title = "index.html links the originals relatively (" + img.getAttribute("src") + "): move the run " +
      "folder together with its inputs, or rerun with --copy-originals to keep copies inside it";
    img.parentNode.replaceWith(note);
  }, true);
  apply();
  window.explorerFirstScreen = setup.times.firstScreen = performance.now();
  document.body.dataset.ready = "1";
})();
