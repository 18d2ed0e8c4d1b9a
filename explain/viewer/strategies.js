/* The strategies view of a run's explorer (explain/viewer/strategies_view.py writes its data,
 * index-data/strategies.js: `explorerStrategies`): per class, the 2-D embedding of its items
 * (an SVG, points coloured by cluster; a click opens the item's image) and a card per cluster:
 * its size, prototype map, mean probability and share of mistakes, the images nearest its
 * centre and its members (a click on one opens it; "show in the grid" filters the rows); one
 * class at a time, chosen in a list where there are several.
 * Plain JavaScript, no library; it runs after explorer.js, whose `explorerView` it reads. */
(function () {
  "use strict";
  var view = window.explorerView;
  if (!view || !view.strategies) return;
  var data = view.strategies, items = data.items, esc = view.esc, percent = view.percent;
  var $ = function (id) { return document.getElementById(id); };
  var SIDE = 320, PAD = 12, LISTED = 500;  // members listed per card (all of them: in the grid)

  function note() {
    var s = view.stale, parts = [];
    if (s.redone) parts.push(s.redone + " clustered map" + (s.redone === 1 ? " was" : "s were") + " redone");
    if (s.added) parts.push(s.added + " map" + (s.added === 1 ? " has" : "s have") + " no cluster (explained since)");
    // items the page does not show: images gone from the run, or past what a page of a very
    // large Ray run shows (its first 100,000 images): said, but not called stale by themselves
    var gone = s.gone ? s.gone + " clustered item" + (s.gone === 1 ? " is" : "s are") + " not on this page" : "";
    if (!parts.length && !gone) return;
    $("strategies-note").hidden = false;
    $("strategies-note").textContent = parts.length ? "These strategies are stale: " + parts.join(", ") +
      " since explain strategies ran" + (gone ? "; " + gone : "") + ". Rerun `explain strategies` on this " +
      "folder to cluster the run as it is now." : "Note: " + gone + ".";
  }

  function membersOf(c) {  // each cluster's items (indices of items), by class index and cluster number
    var members = {};
    for (var k = 0; k < items.input.length; k++) {
      if (items["class"][k] !== c) continue;
      (members[items.cluster[k]] = members[items.cluster[k]] || []).push(k);
    }
    return members;
  }

  function clusterIndex(c, number) {
    for (var k = 0; k < view.clusters.length; k++) {
      if (view.clusters[k].cls === c && view.clusters[k].cluster === number) return k;
    }
    return -1;
  }

  function embedding(c, members) {
    var xs = [], ys = [], ks = [];
    Object.keys(members).forEach(function (number) { ks = ks.concat(members[number]); });
    ks.forEach(function (k) { if (items.x[k] !== null) { xs.push(items.x[k]); ys.push(items.y[k]); } });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    var sx = function (x) { return PAD + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (SIDE - 2 * PAD); };
    var sy = function (y) { return SIDE - PAD - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (SIDE - 2 * PAD); };
    var index = {};  // cluster number -> index of view.clusters
    Object.keys(members).forEach(function (number) { index[number] = clusterIndex(c, +number); });
    var points = ks.filter(function (k) { return items.x[k] !== null; }).map(function (k) {
      var cluster = index[items.cluster[k]], image = view.itemImage[k];
      return '<circle cx="' + sx(items.x[k]).toFixed(1) + '" cy="' + sy(items.y[k]).toFixed(1) + '" r="4.5" fill="' +
        view.clusters[cluster].colour + '" data-cluster="' + cluster + '" data-item="' + k + '"' +
        (image >= 0 ? ' data-image="' + image + '"' : ' class="missing"') + "></circle>";
    });
    // the name of the point under the pointer in the caption (a <title> per point doubles the SVG's elements)
    return '<figure class="embedding"><svg viewBox="0 0 ' + SIDE + " " + SIDE + '" width="' + SIDE + '" height="' + SIDE +
      '" role="img" aria-label="2-D embedding">' + points.join("") + '</svg><figcaption><span class="hovered">' +
      esc(data.classes[c].embedding || "") + " embedding: one point per item, coloured by cluster; point at one " +
      "for its name, click it to open it</span></figcaption></figure>";
  }

  function imageLink(image, text) {
    return image >= 0 ? '<a href="#" data-image="' + image + '">' + esc(text) + "</a>" : esc(text);
  }

  function card(c, cluster, members) {
    var k = clusterIndex(c, cluster.cluster), colour = view.clusters[k].colour, imageOf = Object.create(null);
    (members || []).forEach(function (m) { imageOf[items.input[m]] = view.itemImage[m]; });
    var stats = ["mean probability " + (cluster.mean_probability === null ? "–" : percent(cluster.mean_probability))];
    if (cluster.mistake_share !== null) stats.push("mistakes " + percent(cluster.mistake_share));
    var picture = cluster.prototype ? '<figure class="prototype"><img src="' + esc(cluster.prototype) +
      '" alt="prototype of ' + esc(view.clusters[k].label) + '"><figcaption>prototype (mean map)</figcaption></figure>' : "";
    if (cluster.concepts) {
      picture += '<p class="concepts">concepts: ' + Object.keys(cluster.concepts).map(function (name) {
        return esc(name) + " " + (+cluster.concepts[name]).toFixed(3);
      }).join(", ") + "</p>";
    }
    var nearest = cluster.nearest.map(function (name) {
      var image = name in imageOf ? imageOf[name] : -1, src = image >= 0 ? view.originals[image] : null;
      return '<figure class="near">' + (src ? '<img src="' + esc(src) + '" alt="near the centre" loading="lazy">' : "") +
        "<figcaption>" + imageLink(image, name.split("/").pop()) + "</figcaption></figure>";
    }).join("");
    var all = members || [], list = all.slice(0, LISTED).map(function (m) {
      return "<li>" + imageLink(view.itemImage[m], items.input[m]) + "</li>";
    });
    if (all.length > LISTED) list.push('<li class="muted">and ' + (all.length - LISTED) + " more: show in the grid</li>");
    return '<article class="cluster" data-cluster="' + k + '" style="border-top-color:' + colour + '">' +
      '<h4><span class="swatch" style="background:' + colour + '"></span>cluster ' + cluster.cluster + " · " +
      '<span class="size">' + cluster.size + "</span> item" + (cluster.size === 1 ? "" : "s") + "</h4>" + picture +
      '<p class="stats">' + stats.join(" · ") + "</p>" +
      '<div class="nearest"><h5>nearest its centre</h5>' + nearest + "</div>" +
      '<details class="members"><summary>members (' + all.length + ')</summary><ol>' + list.join("") + "</ol></details>" +
      '<button type="button" class="show-rows" data-cluster="' + k + '">show in the grid</button></article>';
  }

  function classSection(entry, c) {
    var members = membersOf(c);
    return '<section class="strategy-class" data-class="' + esc(entry.name) + '"><h3>' + esc(entry.name) + " · " +
      entry.items + " items (" + esc(entry.features) + ") · " + entry.clusters.length + " cluster" +
      (entry.clusters.length === 1 ? "" : "s") + '</h3><div class="strategy-body">' + embedding(c, members) +
      '<div class="clusters">' + entry.clusters.map(function (cluster) {
        return card(c, cluster, members[cluster.cluster]);
      }).join("") + "</div></div></section>";
  }

  // one class at a time (a run of many classes would draw them all at once otherwise)
  function show() { var c = +$("strategy-class").value; $("strategies-classes").innerHTML = classSection(data.classes[c], c); }
  data.classes.forEach(function (entry, c) {
    var o = document.createElement("option");
    o.value = c;
    o.textContent = entry.name + " · " + entry.items + " items · " + entry.clusters.length + " cluster" +
      (entry.clusters.length === 1 ? "" : "s");
    $("strategy-class").appendChild(o);
  });
  $("strategy-class-control").hidden = data.classes.length < 2;
  $("strategy-class").addEventListener("change", show);
  if (data.classes.length) show();
  note();
  $("strategies").hidden = false;
  $("strategies").addEventListener("mouseover", function (event) {
    var point = event.target.closest("circle[data-item]"), caption = point && point.closest("figure").querySelector(".hovered");
    if (!caption) return;
    var k = +point.dataset.item;
    caption.textContent = items.input[k] + " · " + view.clusters[+point.dataset.cluster].label;
  });
  $("strategies").addEventListener("click", function (event) {
    var target = event.target.closest("[data-image], button.show-rows");
    if (!target) return;
    event.preventDefault();
    if (target.classList.contains("show-rows")) view.showCluster(+target.dataset.cluster);
    else view.openDetail(+target.dataset.image);
  });
})();
